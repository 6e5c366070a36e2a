/*
 * srv_notify.h: systemd readiness notification (sd_notify protocol).
 *
 * When systemd starts flowkv-server with Type=notify it sets NOTIFY_SOCKET
 * to a unix datagram socket (a path, or an abstract name written "@name");
 * the service sends "READY=1" once it serves and "STOPPING=1" on shutdown.
 * The protocol is one datagram of newline-separated assignments
 * (sd_notify(3)); systemd documents it as stable for reimplementation, so
 * this avoids a libsystemd dependency for 40 lines.
 *
 * Thread safety: may be called from any thread.
 */
#ifndef SRV_NOTIFY_H
#define SRV_NOTIFY_H

/* Sends state (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET.
 * Returns 1 if sent, 0 when NOTIFY_SOCKET is unset (not under systemd),
 * FK_EINVAL for a bad socket name or state, or -errno if sending failed. */
int srv_notify(const char *state);

#endif /* SRV_NOTIFY_H */
