/*
 * cli_snap.h: the flowkv CLI's `snapshot` commands (client/cmd/cli_snap.c):
 *   snapshot save FILE [REPLICA]  a backup of one replica's state into FILE
 *                                 (written to FILE.part, renamed when whole)
 *   snapshot status FILE          checks FILE whole and prints what it holds
 * Both return the CLI's exit status (flowkv_cli.c). One thread.
 */
#ifndef CLI_SNAP_H
#define CLI_SNAP_H

#include "flowkv.h"

#include <stdint.h>

/* kv may be NULL for status (it needs no cluster). */
int cli_snapshot(flowkv *kv, int argc, char **argv, uint64_t timeout_ns, int json);

#endif /* CLI_SNAP_H */
