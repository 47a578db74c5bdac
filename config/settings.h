/* The settings table: one row per setting of capstan_config_t that holds one
 * value (a number, a word, a string), with its file key, its flag, its
 * bounds, its words, its default and its help line. The YAML reader, the
 * flags of `capstan run`, capstan_config_new's defaults,
 * capstan_config_validate and --help all read these rows, so a bound or a
 * word is written once. Settings with a structure of their own (queues,
 * labels, plugins, redis, tls, classes, periodic) keep their readers; their
 * flags still have a row here, of type CAPSTAN__SET_OWN, for --help and
 * getopt. Not public. */
#ifndef CAPSTAN_CONFIG_SETTINGS_H
#define CAPSTAN_CONFIG_SETTINGS_H

#include <stddef.h>

#include "capstan/config.h"

typedef enum {
    CAPSTAN__SET_INT,     /* int: a whole number in [min, max] */
    CAPSTAN__SET_LONG,    /* long: a whole number in [min, max] */
    CAPSTAN__SET_SECONDS, /* double: a number of seconds, > 0 (or 0 with
                             CAPSTAN__SET_ZERO_OK), at least min when not 0,
                             at most ten years */
    CAPSTAN__SET_WORD,    /* an int-sized enum: the index of its word */
    CAPSTAN__SET_FLAG,    /* int 0 or 1: true or false (a flag takes no value) */
    CAPSTAN__SET_STRING,  /* char *, owned by the config */
    CAPSTAN__SET_SIZE,    /* long long bytes: 512MB, 2GB, a bare number of MB */
    CAPSTAN__SET_OWN,     /* read by its own code (a flag of args.c or a YAML
                             reader): only its flag and help are here */
} capstan__setting_type_t;

enum {
    CAPSTAN__SET_ZERO_OK = 1,  /* SECONDS: 0 is allowed (off, or chosen by capstan) */
    CAPSTAN__SET_NONEMPTY = 2, /* STRING: "" and null are refused */
    CAPSTAN__SET_TEN_YEARS = 4, /* LONG: seconds, at most ten years as every SECONDS */
};

typedef struct capstan__setting {
    const char *key;       /* the file's key; NULL for a flag alone */
    const char *alias;     /* another key of the file for it, or NULL */
    const char *flag;      /* `capstan run`'s long flag without "--", or NULL */
    const char *flag_alias; /* another long flag for it, or NULL */
    char short_flag;       /* 0 for none */
    capstan__setting_type_t type;
    size_t off;            /* the member of capstan_config_t */
    double min, max;       /* INT, LONG: bounds; SECONDS: the floor other than 0 */
    int opts;              /* CAPSTAN__SET_* options above */
    size_t explicit_off;   /* an int member set to 1 once a file or a flag
                              gave the setting; 0 for none */
    const char *const *words; /* WORD: NULL-terminated, the value's index */
    const char *def;       /* the default, as text read by the same parser;
                              NULL for none (0 or NULL) */
    const char *arg;       /* the flag's value in --help ("N", "PATH") */
    const char *help;      /* --help's text; "\n" starts a continuation line */
} capstan__setting_t;

/* Every row, in --help's order; *n gets the count. */
const capstan__setting_t *capstan__settings(size_t *n);

/* The row whose file key (or alias) is key, or NULL. */
const capstan__setting_t *capstan__setting_by_key(const char *key);

/* Sets s's member of cfg from text (NULL: the file's null, which gives the
 * default of a string, or "true" for a flag given without a value). Returns
 * 0, CAPSTAN_ENOMEM, or CAPSTAN_ECONFIG with what the value must be in why
 * (CAPSTAN_ERRLEN, without the key: "must be an integer between 1 and
 * 1000"). Does not set explicit_off (capstan__setting_given does). */
int capstan__setting_set(capstan_config_t *cfg, const capstan__setting_t *s, const char *text,
                         char *why);

/* Marks s as given by a file or a flag (explicit_off). */
void capstan__setting_given(capstan_config_t *cfg, const capstan__setting_t *s);

/* Whether the value cfg holds for s is one it may hold: 0, or
 * CAPSTAN_ECONFIG with "key: must be ..." in err. */
int capstan__setting_check(const capstan_config_t *cfg, const capstan__setting_t *s, char *err);

/* Writes what a value of s must be into buf ("must be reliable or basic"). */
void capstan__setting_want(const capstan__setting_t *s, char *buf, size_t size);

/* Sets every row's default into cfg. Returns 0 or CAPSTAN_ENOMEM. */
int capstan__settings_defaults(capstan_config_t *cfg);

/* Frees the strings the rows own in cfg. */
void capstan__settings_free(capstan_config_t *cfg);

/* YAML 1.1 booleans (true/yes/on, false/no/off, any case), which is what
 * Psych reads in a sidekiq.yml: 0 with *out set, or CAPSTAN_EINVAL. */
int capstan__setting_bool(const char *s, int *out);

/* The index of word in s's words, or -1. */
int capstan__setting_word(const capstan__setting_t *s, const char *word);

#endif
