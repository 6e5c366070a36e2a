/*
 * fk_auth.h: proving knowledge of the cluster token without sending it.
 *
 * Every connection to a flowkv node (replica to replica, client to replica)
 * starts with a mutual challenge-response, so a stranger can neither join
 * a cluster nor issue requests, and a sniffed handshake cannot be replayed:
 *
 *   dialer -> listener : nonce_d                       (FK_AUTH_NONCE bytes)
 *   listener -> dialer : nonce_l, proof(LISTENER, nonce_l, nonce_d)
 *   dialer -> listener : proof(DIALER, nonce_d, nonce_l)
 *
 * proof(role, a, b) = HMAC-SHA-256(key, "flowkv-auth-v1" || role || a || b)
 * with key = SHA-256(token). The role byte stops a proof from being
 * reflected back at its sender; fresh random nonces on both sides stop
 * replay. HMAC and SHA-256 come from libsodium (Debian's libsodium-dev),
 * which also supplies the random nonces and a constant-time comparison:
 * cryptography is where a well-kept library beats hand-written code.
 *
 * Thread safety: all functions are thread-safe after fk_auth_init().
 */
#ifndef FK_AUTH_H
#define FK_AUTH_H

#include <stdint.h>

#define FK_AUTH_NONCE 32
#define FK_AUTH_PROOF 32

enum fk_auth_role { FK_AUTH_DIALER = 'D', FK_AUTH_LISTENER = 'L' };

/* Initialises libsodium; idempotent. Returns 0 or FK_EINVAL if the library
 * cannot start (no entropy source). */
int fk_auth_init(void);

/* Fills out with a fresh random nonce. */
void fk_auth_nonce(uint8_t out[FK_AUTH_NONCE]);

/* Computes the proof that role knows token, bound to (own, peer) nonces.
 * token is the NUL-terminated cluster token. */
void fk_auth_proof(const char *token, enum fk_auth_role role, const uint8_t own[FK_AUTH_NONCE],
                   const uint8_t peer[FK_AUTH_NONCE], uint8_t out[FK_AUTH_PROOF]);

/* Verifies a proof received from the peer playing role, who sent
 * peer_nonce and received own_nonce. Returns 0, or FK_EAUTH on mismatch
 * (compared in constant time). */
int fk_auth_verify(const char *token, enum fk_auth_role role,
                   const uint8_t peer_nonce[FK_AUTH_NONCE], const uint8_t own_nonce[FK_AUTH_NONCE],
                   const uint8_t proof[FK_AUTH_PROOF]);

#endif /* FK_AUTH_H */
