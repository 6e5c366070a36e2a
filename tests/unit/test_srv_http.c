/* Unit tests for server/srv_http: the metrics endpoint, on a real socket. */
#include "check.h"
#include "fk_error.h"
#include "srv_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

static uv_loop_t loop;
static uv_async_t stop_async;
static struct srv_http *http;
static pthread_t loop_thread;

static int handler(void *arg, const char *path, char *body, size_t cap, const char **ctype,
                   int *status)
{
    if (strcmp(path, "/metrics") == 0)
        return snprintf(body, cap, "flowkv_up 1\n");
    if (strcmp(path, "/health") == 0) {
        *status = 503;
        *ctype = "application/json";
        return snprintf(body, cap, "{\"health\":\"false\"}\n");
    }
    if (strcmp(path, "/big") == 0) {
        memset(body, 'x', 100000);
        return 100000;
    }
    return -1;
}

static void on_stop(uv_async_t *a)
{
    srv_http_stop(http);
    uv_close((uv_handle_t *)a, NULL);
}

static void *run_loop(void *arg)
{
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

static void start(void)
{
    CHECK_OK(uv_loop_init(&loop));
    CHECK_OK(srv_http_start(&loop, "127.0.0.1:0", handler, NULL, &http));
    CHECK(srv_http_port(http) > 0);
    uv_async_init(&loop, &stop_async, on_stop);
    CHECK(pthread_create(&loop_thread, NULL, run_loop, NULL) == 0);
}

static void stop(void)
{
    uv_async_send(&stop_async);
    CHECK(pthread_join(loop_thread, NULL) == 0);
    /* The loop ended: every handle, connections included, was closed. */
    CHECK_OK(uv_loop_close(&loop));
}

static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(srv_http_port(http))};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    return fd;
}

/* Sends req (may be NULL) and reads the whole response into a static buffer. */
static const char *exchange(const char *req)
{
    static char resp[200000];
    int fd = dial();
    if (req)
        CHECK(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
    size_t used = 0;
    ssize_t n;
    while (used < sizeof resp - 1 && (n = read(fd, resp + used, sizeof resp - 1 - used)) > 0)
        used += (size_t)n;
    resp[used] = '\0';
    close(fd);
    return resp;
}

TEST(http_serves_metrics_and_errors)
{
    start();
    const char *r = exchange("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK_MSG(strncmp(r, "HTTP/1.1 200 OK\r\n", 17) == 0, "got '%s'", r);
    CHECK(strstr(r, "Content-Length: 12\r\n") != NULL);
    CHECK(strstr(r, "\r\n\r\nflowkv_up 1\n") != NULL);
    CHECK(strncmp(exchange("GET /nope HTTP/1.1\r\n\r\n"), "HTTP/1.1 404", 12) == 0);
    r = exchange("GET /health HTTP/1.1\r\n\r\n");
    CHECK_MSG(strncmp(r, "HTTP/1.1 503 Service Unavailable\r\n", 34) == 0, "got '%s'", r);
    CHECK(strstr(r, "application/json") != NULL && strstr(r, "{\"health\":\"false\"}") != NULL);
    CHECK(strncmp(exchange("POST /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405", 12) == 0);
    CHECK(strncmp(exchange("garbage\r\n\r\n"), "HTTP/1.1 400", 12) == 0);
    char big[6000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    CHECK(strncmp(exchange(big), "HTTP/1.1 431", 12) == 0);
    r = exchange("GET /big?x=1 HTTP/1.0\r\n\r\n");
    CHECK(strstr(r, "Content-Length: 100000\r\n") != NULL);
    CHECK_EQ_U64(strlen(strstr(r, "\r\n\r\n") + 4), 100000);
    stop();
}

TEST(http_limits_connections_and_times_out_idle_ones)
{
    start();
    int fds[SRV_HTTP_CONN_MAX];
    for (int i = 0; i < SRV_HTTP_CONN_MAX; i++)
        fds[i] = dial();
    /* All slots are held by idle clients: the next one gets 503 at once. */
    usleep(100000);
    CHECK(strncmp(exchange("GET /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 503", 12) == 0);
    /* Idle connections are closed after SRV_HTTP_TIMEOUT_MS. */
    char c;
    CHECK_EQ_I64(read(fds[0], &c, 1), 0);
    for (int i = 0; i < SRV_HTTP_CONN_MAX; i++)
        close(fds[i]);
    usleep(100000);
    CHECK(strncmp(exchange("GET /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 200", 12) == 0);
    stop();
}

TEST(http_bad_addresses_are_errors)
{
    uv_loop_t l;
    struct srv_http *h = NULL;
    CHECK_OK(uv_loop_init(&l));
    CHECK_ERR(srv_http_start(&l, "nonsense", handler, NULL, &h), FK_EINVAL);
    CHECK_ERR(srv_http_start(&l, "999.1.1.1:80", handler, NULL, &h), FK_EINVAL);
    CHECK(h == NULL);
    CHECK_OK(srv_http_start(&l, "127.0.0.1:0", handler, NULL, &h));
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", srv_http_port(h));
    struct srv_http *h2 = NULL;
    CHECK_ERR(srv_http_start(&l, addr, handler, NULL, &h2), -EADDRINUSE);
    srv_http_stop(h);
    uv_run(&l, UV_RUN_DEFAULT);
    CHECK_OK(uv_loop_close(&l));
}

CHECK_MAIN()
