/*
 * The exec shim's loopback relay (relay.c): for a session whose network is "proxy", TCP
 * connections to 127.0.0.1:PORT inside the sandbox, each joined to the unix stream socket
 * at a path inside it (nsconfine's proxy, bound in by the launcher).
 */
#ifndef NSCONFINE_RELAY_H
#define NSCONFINE_RELAY_H

#include "freestanding.h"

#define RELAY_MAX_PATH 108 /* sun_path's size, its NUL included */
#define CLONE_PARENT_ 0x00008000

/*
 * Listen on 127.0.0.1:port and start the relay on that listener as the caller's sibling
 * (its parent's child); the caller keeps no fd of it. 0 once the relay is started (the
 * port is then taken, and connections queue until the relay accepts them), or -errno.
 */
long start_relay(long port, const char *socket_path, uint64_t open_files);

#endif
