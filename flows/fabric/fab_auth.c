/*
 * fab_auth.c: the cluster-token handshake on every connection (fab.h,
 * "Authentication"; the proofs are common/fk_auth.h's).
 *
 * It is two control messages, the first two on the connection, so it needs
 * nothing of a backend but fab_call and a per-connection struct fab__auth:
 *
 *   dialer -> listener  HELLO  = magic "FKA1", nonce_d
 *   listener -> dialer          nonce_l, proof(LISTENER, nonce_l, nonce_d)
 *   dialer -> listener  PROVE  = magic "FKA2", proof(DIALER, nonce_d, nonce_l)
 *   listener -> dialer          status 0 (or FK_EAUTH)
 *
 * The listener's state machine (enum fab__auth_state) tells the two
 * messages from the node's own control messages: nothing reaches the call
 * handler before the proof, and one wrong message fails the connection for
 * good, so a stranger gets one guess per connection and learns nothing but
 * FK_EAUTH.
 */
#include "fab_impl.h"

#include "fk_error.h"
#include "fk_log.h"

#include <assert.h>
#include <string.h>

#define AUTH_MAGIC_LEN 4
static const uint8_t hello_magic[AUTH_MAGIC_LEN] = {'F', 'K', 'A', '1'};
static const uint8_t prove_magic[AUTH_MAGIC_LEN] = {'F', 'K', 'A', '2'};

#define HELLO_LEN     (AUTH_MAGIC_LEN + FK_AUTH_NONCE)
#define CHALLENGE_LEN (FK_AUTH_NONCE + FK_AUTH_PROOF)
#define PROVE_LEN     (AUTH_MAGIC_LEN + FK_AUTH_PROOF)
_Static_assert(CHALLENGE_LEN <= FAB_MSG_MAX && HELLO_LEN <= FAB_MSG_MAX, "auth fits a message");

static int refuse(fab_node *n, struct fab__auth *a, uint64_t peer_id, const char *why)
{
    if (a->state != FAB__AUTH_FAILED)
        fk_warn("flows", "fabric %s: refused connection %llu: %s", n->addr,
                (unsigned long long)peer_id, why);
    a->state = FAB__AUTH_FAILED;
    return FK_EAUTH;
}

/* HELLO: answer with our nonce and our proof. */
static int on_hello(fab_node *n, struct fab__auth *a, uint64_t peer_id, const uint8_t *req,
                    size_t len, uint8_t *resp, size_t cap)
{
    if (len != HELLO_LEN || memcmp(req, hello_magic, AUTH_MAGIC_LEN) != 0)
        return refuse(n, a, peer_id, "no cluster token handshake (wrong or missing token)");
    if (cap < CHALLENGE_LEN)
        return FK_EINVAL;
    memcpy(a->peer, req + AUTH_MAGIC_LEN, FK_AUTH_NONCE);
    fk_auth_nonce(a->own);
    memcpy(resp, a->own, FK_AUTH_NONCE);
    fk_auth_proof(n->token, FK_AUTH_LISTENER, a->own, a->peer, resp + FK_AUTH_NONCE);
    a->state = FAB__AUTH_CHALLENGED;
    return CHALLENGE_LEN;
}

/* PROVE: the dialer's proof over both nonces. */
static int on_prove(fab_node *n, struct fab__auth *a, uint64_t peer_id, const uint8_t *req,
                    size_t len, int *granted)
{
    if (len != PROVE_LEN || memcmp(req, prove_magic, AUTH_MAGIC_LEN) != 0 ||
        fk_auth_verify(n->token, FK_AUTH_DIALER, a->peer, a->own, req + AUTH_MAGIC_LEN) != 0)
        return refuse(n, a, peer_id, "wrong cluster token");
    a->state = FAB__AUTH_OK;
    *granted = 1;
    return 0;
}

int fab__serve_call(fab_node *n, struct fab__auth *a, uint64_t peer_id, const void *req, size_t len,
                    void *resp, size_t cap, int *granted)
{
    *granted = 0;
    if (n->token[0] != '\0' && a->state != FAB__AUTH_OK) {
        switch (a->state) {
        case FAB__AUTH_NONE:
            return on_hello(n, a, peer_id, req, len, resp, cap);
        case FAB__AUTH_CHALLENGED:
            return on_prove(n, a, peer_id, req, len, granted);
        default:
            return FK_EAUTH;
        }
    }
    struct fab__handlers h = fab__handler_enter(n);
    int rc = h.call != NULL ? h.call(h.data, peer_id, req, len, resp, cap) : FK_EINVAL;
    fab__handler_exit(n);
    return rc;
}

int fab__auth_dial(fab_conn *conn, uint64_t timeout_ns)
{
    fab_node *n = conn->node;
    assert(n->token[0] != '\0');
    uint8_t hello[HELLO_LEN], challenge[CHALLENGE_LEN], prove[PROVE_LEN];
    uint8_t nonce[FK_AUTH_NONCE];
    fk_auth_nonce(nonce);
    memcpy(hello, hello_magic, AUTH_MAGIC_LEN);
    memcpy(hello + AUTH_MAGIC_LEN, nonce, FK_AUTH_NONCE);
    int rc = n->ops->call(conn, hello, sizeof(hello), challenge, sizeof(challenge), timeout_ns);
    if (rc == FK_ETIMEDOUT || rc == FK_EUNREACHABLE || rc == FK_EPOISONED)
        return rc;
    /* Any other answer than a challenge, a listener without a token (its
     * handler refuses HELLO) included, is a peer that did not prove it. */
    if (rc != CHALLENGE_LEN)
        return FK_EAUTH;
    int trusted = fk_auth_verify(n->token, FK_AUTH_LISTENER, challenge, nonce,
                                 challenge + FK_AUTH_NONCE) == 0;
    /* Our proof goes out even to a listener that failed its own, so that a
     * listener with another token logs the mismatch too (it learns nothing:
     * the proof is bound to these two fresh nonces). */
    memcpy(prove, prove_magic, AUTH_MAGIC_LEN);
    fk_auth_proof(n->token, FK_AUTH_DIALER, nonce, challenge, prove + AUTH_MAGIC_LEN);
    rc = n->ops->call(conn, prove, sizeof(prove), NULL, 0, timeout_ns);
    if (rc == FK_ETIMEDOUT || rc == FK_EUNREACHABLE)
        return rc;
    return rc == 0 && trusted ? 0 : FK_EAUTH;
}
