/* srv_http.c: minimal GET-only HTTP endpoint; see srv_http.h. */
#include "srv_http.h"

#include "fk_conf.h"
#include "fk_error.h"
#include "fk_log.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct srv__conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wr;
    struct srv_http *owner;
    char req[SRV_HTTP_REQ_MAX];
    size_t used;
    char *resp;   /* heap response, freed after the write */
    int in_use;   /* slot taken */
    int open;     /* handles not yet closed (tcp, timer) */
    int answered; /* a response is queued; ignore further input */
};

struct srv_http {
    uv_loop_t *loop;
    uv_tcp_t listener;
    srv_http_handler fn;
    void *arg;
    int port;
    int stopping;
    int open;    /* handles not yet closed, listener included */
    int pending; /* a connection waits in libuv for a free slot */
    /* One slot more than the limit: an extra connection is accepted into it
     * and answered 503, because libuv pauses the listener until accepted. */
    struct srv__conn conns[SRV_HTTP_CONN_MAX + 1];
};

static void srv__accept(struct srv_http *h);

static void srv__maybe_free(struct srv_http *h)
{
    if (h->stopping && h->open == 0)
        free(h);
}

static void srv__on_conn_closed(uv_handle_t *handle)
{
    struct srv__conn *c = handle->data;
    struct srv_http *h = c->owner;
    assert(c->open > 0 && h->open > 0);
    c->open--;
    h->open--;
    if (c->open == 0) {
        free(c->resp);
        c->resp = NULL;
        c->in_use = 0;
        if (h->pending && !h->stopping)
            srv__accept(h);
    }
    srv__maybe_free(h);
}

static void srv__conn_close(struct srv__conn *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, srv__on_conn_closed);
    if (!uv_is_closing((uv_handle_t *)&c->timer))
        uv_close((uv_handle_t *)&c->timer, srv__on_conn_closed);
}

static void srv__on_written(uv_write_t *wr, int status)
{
    srv__conn_close(wr->data);
}

/* Queues status line, headers and body, then closes after the write. */
static void srv__respond(struct srv__conn *c, int code, const char *reason, const char *ctype,
                         const char *body, size_t blen)
{
    enum { HEAD_MAX = 256 };
    c->answered = 1;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->resp = malloc(HEAD_MAX + blen);
    if (c->resp == NULL) {
        srv__conn_close(c);
        return;
    }
    int n = snprintf(c->resp, HEAD_MAX,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     code, reason, ctype, blen);
    assert(n > 0 && n < HEAD_MAX);
    memcpy(c->resp + n, body, blen);
    uv_buf_t buf = uv_buf_init(c->resp, (unsigned)(n + (int)blen));
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &buf, 1, srv__on_written) != 0)
        srv__conn_close(c);
}

static void srv__error(struct srv__conn *c, int code, const char *reason)
{
    char body[64];
    int n = snprintf(body, sizeof body, "%d %s\n", code, reason);
    srv__respond(c, code, reason, "text/plain", body, (size_t)n);
}

/* Called once the head is complete: dispatch GET path to the handler. */
static void srv__handle(struct srv__conn *c)
{
    char method[8], path[256], version[16];
    if (sscanf(c->req, "%7s %255s %15s", method, path, version) != 3 ||
        strncmp(version, "HTTP/1.", 7) != 0 || path[0] != '/') {
        srv__error(c, 400, "Bad Request");
        return;
    }
    if (strcmp(method, "GET") != 0) {
        srv__error(c, 405, "Method Not Allowed");
        return;
    }
    char *q = strchr(path, '?');
    if (q)
        *q = '\0';
    char *body = malloc(SRV_HTTP_BODY_MAX);
    if (body == NULL) {
        srv__error(c, 500, "Internal Server Error");
        return;
    }
    const char *ctype = "text/plain; version=0.0.4; charset=utf-8";
    int status = 200;
    int n = c->owner->fn(c->owner->arg, path, body, SRV_HTTP_BODY_MAX, &ctype, &status);
    if (n < 0)
        srv__error(c, 404, "Not Found");
    else if (status == 503)
        srv__respond(c, 503, "Service Unavailable", ctype, body, (size_t)n);
    else
        srv__respond(c, 200, "OK", ctype, body, (size_t)n);
    free(body);
}

static void srv__alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    struct srv__conn *c = handle->data;
    /* Reads land directly in the request buffer; one byte stays free for
     * the terminating NUL. A full buffer yields a zero-length read. */
    *buf = uv_buf_init(c->req + c->used, (unsigned)(sizeof c->req - 1 - c->used));
}

static void srv__on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct srv__conn *c = s->data;
    if (c->answered)
        return;
    if (nread < 0) {
        srv__conn_close(c);
        return;
    }
    c->used += (size_t)nread;
    c->req[c->used] = '\0';
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n"))
        srv__handle(c);
    else if (c->used >= sizeof c->req - 1)
        srv__error(c, 431, "Request Header Fields Too Large");
}

static void srv__on_timeout(uv_timer_t *t)
{
    struct srv__conn *c = t->data;
    if (!c->answered)
        srv__conn_close(c);
}

static struct srv__conn *srv__free_slot(struct srv_http *h)
{
    for (int i = 0; i <= SRV_HTTP_CONN_MAX; i++)
        if (!h->conns[i].in_use)
            return &h->conns[i];
    return NULL;
}

static void srv__accept(struct srv_http *h)
{
    struct srv__conn *c = srv__free_slot(h);
    if (c == NULL) {
        h->pending = 1; /* accepted when a slot closes */
        return;
    }
    h->pending = 0;
    memset(c, 0, sizeof *c);
    c->owner = h;
    c->in_use = 1;
    uv_tcp_init(h->loop, &c->tcp);
    uv_timer_init(h->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open = 2;
    h->open += 2;
    if (uv_accept((uv_stream_t *)&h->listener, (uv_stream_t *)&c->tcp) != 0) {
        srv__conn_close(c);
        return;
    }
    if (c == &h->conns[SRV_HTTP_CONN_MAX]) {
        srv__error(c, 503, "Service Unavailable");
        return;
    }
    uv_timer_start(&c->timer, srv__on_timeout, SRV_HTTP_TIMEOUT_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, srv__alloc, srv__on_read) != 0)
        srv__conn_close(c);
}

static void srv__on_connection(uv_stream_t *server, int status)
{
    struct srv_http *h = server->data;
    if (status < 0 || h->stopping)
        return;
    srv__accept(h);
}

static void srv__on_listener_closed(uv_handle_t *handle)
{
    struct srv_http *h = handle->data;
    h->open--;
    srv__maybe_free(h);
}

int srv_http_start(uv_loop_t *loop, const char *address, srv_http_handler fn, void *arg,
                   struct srv_http **out)
{
    char ip[FK_CONF_STR_MAX];
    uint16_t port = 0;
    struct sockaddr_storage sa;
    if (loop == NULL || fn == NULL || out == NULL || address == NULL)
        return FK_EINVAL;
    /* Port 0 is allowed here (tests): split with a fake port, then parse. */
    const char *colon = strrchr(address, ':');
    if (colon && strcmp(colon, ":0") == 0) {
        char tmp[FK_CONF_STR_MAX];
        snprintf(tmp, sizeof tmp, "%.*s:1", (int)(colon - address), address);
        if (fk_conf_split_address(tmp, ip, sizeof ip, &port) < 0)
            return FK_EINVAL;
        port = 0;
    } else if (fk_conf_split_address(address, ip, sizeof ip, &port) < 0) {
        return FK_EINVAL;
    }
    if (uv_ip4_addr(ip, port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(ip, port, (struct sockaddr_in6 *)&sa) != 0)
        return FK_EINVAL;
    struct srv_http *h = calloc(1, sizeof *h);
    if (h == NULL)
        return FK_ENOMEM;
    h->loop = loop;
    h->fn = fn;
    h->arg = arg;
    uv_tcp_init(loop, &h->listener);
    h->listener.data = h;
    h->open = 1;
    int rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&h->listener, 64, srv__on_connection);
    if (rc != 0) {
        h->stopping = 1;
        uv_close((uv_handle_t *)&h->listener, srv__on_listener_closed);
        return rc; /* libuv errors are negated errno values */
    }
    struct sockaddr_storage bound;
    int len = sizeof bound;
    uv_tcp_getsockname(&h->listener, (struct sockaddr *)&bound, &len);
    h->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                               : ((struct sockaddr_in6 *)&bound)->sin6_port);
    *out = h;
    return 0;
}

int srv_http_port(const struct srv_http *h)
{
    return h->port;
}

void srv_http_stop(struct srv_http *h)
{
    if (h == NULL || h->stopping)
        return;
    h->stopping = 1;
    for (int i = 0; i <= SRV_HTTP_CONN_MAX; i++)
        if (h->conns[i].in_use)
            srv__conn_close(&h->conns[i]);
    uv_close((uv_handle_t *)&h->listener, srv__on_listener_closed);
}
