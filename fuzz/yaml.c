/* The capstan.yml loader, its ERB rendering included: any file loads or is
 * refused with one "path:line: ..." message, and a loaded config passes or fails
 * capstan_config_validate cleanly. The loader reads a path, so each input is
 * written over one temporary file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capstan/config.h"
#include "capstan/error.h"

#define CHECK(c) ((c) ? (void)0 : abort())

static char path[] = "/dev/shm/capstan-fuzz-yaml-XXXXXX";
static int fd = -1;

static void remove_file(void)
{
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fd < 0) {
        fd = mkstemp(path);
        CHECK(fd >= 0);
        atexit(remove_file);
        /* ${VAR} references and ERB's ENV expand: one set, one empty,
         * one an integer, others unset. */
        setenv("CAPSTAN_FUZZ_SET", "redis://127.0.0.1:6379/1", 1);
        setenv("CAPSTAN_FUZZ_EMPTY", "", 1);
        setenv("CAPSTAN_FUZZ_INT", " 0x1_f ", 1);
    }
    CHECK(ftruncate(fd, 0) == 0);
    CHECK(pwrite(fd, data, size, 0) == (ssize_t)size);

    char err[CAPSTAN_ERRLEN] = "";
    capstan_config_t *cfg = capstan_config_new();
    CHECK(cfg != NULL);
    int rc = capstan_config_load_file(cfg, path, err);
    if (rc == 0) {
        rc = capstan_config_validate(cfg, err);
        CHECK(rc == 0 || rc == CAPSTAN_ECONFIG);
        CHECK(rc == 0 || err[0] != '\0');
    } else {
        CHECK(rc == CAPSTAN_ECONFIG || rc == CAPSTAN_EPARSE);
        CHECK(strncmp(err, path, strlen(path)) == 0 && err[strlen(path)] == ':');
    }
    capstan_config_free(cfg);
    return 0;
}
