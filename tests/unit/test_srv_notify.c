/* Unit tests for server/srv_notify: datagrams reach $NOTIFY_SOCKET. */
#include "check.h"
#include "fk_error.h"
#include "srv_notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int listen_on(const char *name, int abstract)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, name);
    if (abstract)
        sa.sun_path[0] = '\0';
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name));
    CHECK(bind(fd, (struct sockaddr *)&sa, len) == 0);
    return fd;
}

static void expect_datagram(int fd, const char *want)
{
    char buf[128];
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    CHECK(n > 0);
    buf[n] = '\0';
    CHECK_EQ_STR(buf, want);
}

TEST(notify_without_systemd_is_a_no_op)
{
    unsetenv("NOTIFY_SOCKET");
    CHECK_EQ_I64(srv_notify("READY=1"), 0);
}

TEST(notify_path_and_abstract_sockets)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/fknotify.%d", (int)getpid());
    unlink(path);
    int fd = listen_on(path, 0);
    setenv("NOTIFY_SOCKET", path, 1);
    CHECK_EQ_I64(srv_notify("READY=1\nSTATUS=serving"), 1);
    expect_datagram(fd, "READY=1\nSTATUS=serving");
    close(fd);
    unlink(path);

    char name[64];
    snprintf(name, sizeof name, "@fknotify.%d", (int)getpid());
    fd = listen_on(name, 1);
    setenv("NOTIFY_SOCKET", name, 1);
    CHECK_EQ_I64(srv_notify("STOPPING=1"), 1);
    expect_datagram(fd, "STOPPING=1");
    close(fd);
}

TEST(notify_errors)
{
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    CHECK_ERR(srv_notify("READY=1"), FK_EINVAL);
    setenv("NOTIFY_SOCKET", "/tmp/fk-no-such-notify-socket", 1);
    CHECK_ERR(srv_notify("READY=1"), -ENOENT);
    CHECK_ERR(srv_notify(""), FK_EINVAL);
}

CHECK_MAIN()
