/* Shared libraries opened the first time they are needed (libcrypto for
 * uniqueness digests, libssl for rediss://, libz for error backtraces): a
 * worker that never needs one never maps it, where linked each would add
 * to every worker's resident memory. */
#ifndef CAPSTAN_SUPPORT_DL_H
#define CAPSTAN_SUPPORT_DL_H

/* dlopen of "<base>.so.<version>", else of "<base>.so" (a development
 * install's name), with RTLD_NOW | RTLD_LOCAL. NULL when neither opens. */
void *capstan__dlopen_lib(const char *base, const char *version);

#endif
