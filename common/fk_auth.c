/* fk_auth.c: token proofs over libsodium's HMAC-SHA-256; see fk_auth.h. */
#include "fk_auth.h"

#include "fk_error.h"

#include <sodium.h>
#include <string.h>

static const char fk__context[] = "flowkv-auth-v1";

int fk_auth_init(void)
{
    /* sodium_init returns 0 on first success, 1 when already initialised. */
    return sodium_init() < 0 ? FK_EINVAL : 0;
}

void fk_auth_nonce(uint8_t out[FK_AUTH_NONCE])
{
    randombytes_buf(out, FK_AUTH_NONCE);
}

void fk_auth_proof(const char *token, enum fk_auth_role role, const uint8_t own[FK_AUTH_NONCE],
                   const uint8_t peer[FK_AUTH_NONCE], uint8_t out[FK_AUTH_PROOF])
{
    _Static_assert(FK_AUTH_PROOF == crypto_auth_hmacsha256_BYTES, "proof is one HMAC-SHA-256");
    _Static_assert(crypto_hash_sha256_BYTES == crypto_auth_hmacsha256_KEYBYTES, "key size");
    uint8_t key[crypto_auth_hmacsha256_KEYBYTES];
    crypto_hash_sha256(key, (const unsigned char *)token, strlen(token));
    crypto_auth_hmacsha256_state st;
    uint8_t r = (uint8_t)role;
    crypto_auth_hmacsha256_init(&st, key, sizeof key);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)fk__context, sizeof fk__context - 1);
    crypto_auth_hmacsha256_update(&st, &r, 1);
    crypto_auth_hmacsha256_update(&st, own, FK_AUTH_NONCE);
    crypto_auth_hmacsha256_update(&st, peer, FK_AUTH_NONCE);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(key, sizeof key);
    sodium_memzero(&st, sizeof st);
}

int fk_auth_verify(const char *token, enum fk_auth_role role,
                   const uint8_t peer_nonce[FK_AUTH_NONCE], const uint8_t own_nonce[FK_AUTH_NONCE],
                   const uint8_t proof[FK_AUTH_PROOF])
{
    uint8_t want[FK_AUTH_PROOF];
    fk_auth_proof(token, role, peer_nonce, own_nonce, want);
    int ok = sodium_memcmp(want, proof, FK_AUTH_PROOF) == 0;
    return ok ? 0 : FK_EAUTH;
}
