/*
 * srv_http.h: a minimal HTTP/1.1 endpoint on libuv for the metrics and
 * health pages of flowkv-server.
 *
 * It answers GET requests only, one request per connection (Connection:
 * close), with a response body produced by a caller-supplied handler. It is
 * not a general web server: request heads over SRV_HTTP_REQ_MAX bytes get
 * 431, other methods 405, malformed requests 400, and at most
 * SRV_HTTP_CONN_MAX connections are served at once (more are closed at
 * accept), so a misbehaving scraper cannot exhaust memory.
 *
 * Thread safety: everything runs on the loop's thread; the handler is
 * called there too, which is what lets it read histograms owned by that
 * thread.
 */
#ifndef SRV_HTTP_H
#define SRV_HTTP_H

#include <stddef.h>
#include <uv.h>

#define SRV_HTTP_REQ_MAX  4096
#define SRV_HTTP_CONN_MAX 16
#define SRV_HTTP_BODY_MAX (256 * 1024)
/* Requests must complete within this time or the connection is closed. */
#define SRV_HTTP_TIMEOUT_MS 5000

/* Fills body (capacity cap) for path; returns the body length with *ctype
 * set and *status (200 unless the handler says otherwise, e.g. 503 for an
 * unhealthy /health), or any negative value for 404. */
typedef int (*srv_http_handler)(void *arg, const char *path, char *body, size_t cap,
                                const char **ctype, int *status);

struct srv_http;

/* Listens on address ("127.0.0.1:9100", "[::1]:0"; port 0 picks a free
 * port) on loop. On success *out is the endpoint; srv_http_port() says the
 * port bound. Errors: FK_EINVAL (bad address), FK_ENOMEM, or a negated
 * libuv/errno code (e.g. -EADDRINUSE). */
int srv_http_start(uv_loop_t *loop, const char *address, srv_http_handler fn, void *arg,
                   struct srv_http **out);

int srv_http_port(const struct srv_http *h);

/* Stops listening and closes open connections; the memory is freed once the
 * loop has run the close callbacks (run the loop afterwards). Safe on NULL. */
void srv_http_stop(struct srv_http *h);

#endif /* SRV_HTTP_H */
