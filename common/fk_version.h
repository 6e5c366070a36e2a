/*
 * fk_version.h: the release every program reports with --version
 * (flowkv, flowkv-server, flowkv-ycsb, flowkv-sim) and the pkg-config file
 * carries (Makefile, FLOWKV_VERSION).
 */
#ifndef FK_VERSION_H
#define FK_VERSION_H

#define FK_VERSION "0.1.0"

#endif /* FK_VERSION_H */
