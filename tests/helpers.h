/* Test fixture: one private redis-server per test program (started before
 * the first test, stopped after the last), a fresh database per test, and
 * helpers to run the capstan binary and Ruby Sidekiq scripts against it. */
#ifndef CAPSTAN_TEST_HELPERS_H
#define CAPSTAN_TEST_HELPERS_H

#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <sys/types.h>

#include "capstan/redis.h"

/* Starts/stops the shared server; called from the report hooks. */
void kt_server_start(void);
void kt_server_stop(void);

/* redis://127.0.0.1:PORT/DB for this test's own database. */
const char *kt_url(void);
/* The same database as the default user, when kt_url() names the
 * restricted user (KT_RESTRICTED_USER set): for what needs @dangerous
 * commands, such as a Ruby Sidekiq server's boot. */
const char *kt_admin_url(void);
/* A connection to this test's database (owned by the fixture). */
redisContext *kt_redis(void);
/* Runs a command on kt_redis(); the caller frees the reply. Fails the test
 * on a connection error. */
redisReply *kt_cmd(const char *fmt, ...);
/* Integer result of a command (LLEN, SCARD, ...); strings are converted. */
long long kt_int(const char *fmt, ...);
/* kt_int on any connection (a private server's); fails the test on a
 * connection error. */
long long kt_int_on(redisContext *c, const char *fmt, ...);

/* A redis-server of the test's own, for tests that kill or restart Redis
 * (never the shared one): it writes every command to its append-only file
 * before answering, so a kill -9 loses nothing it acknowledged, and a
 * restart in the same directory brings the data back. */
typedef struct kt_aof_redis {
    pid_t pid;
    int port;
    char dir[400];
    char url[128];
} kt_aof_redis_t;

/* Picks a free port and a directory under the test's temp dir (name). */
void kt_aof_init(kt_aof_redis_t *s, const char *name);
/* Starts the server (tracked for kt_kill_children) and waits until it
 * answers PING, which it does not while it loads its file. */
void kt_aof_start(kt_aof_redis_t *s);
/* A connection to it (the caller frees it), or NULL if it does not answer. */
redisContext *kt_aof_connect(const kt_aof_redis_t *s);
/* Kills it outright (SIGKILL): no goodbye to its clients. */
void kt_aof_kill(kt_aof_redis_t *s);

/* A redis-server of the test's own without persistence, for tests that
 * need several and never restart them. */
typedef struct kt_own_server {
    pid_t pid;
    int port;
    char url[128];
    redisContext *conn; /* connected; the test's to use */
} kt_own_server_t;
/* Starts s on a free port in the folder name of the test's temp dir
 * (tracked for kt_kill_children) and waits until it answers PING. */
void kt_own_server_start(kt_own_server_t *s, const char *name);

/* String result of a command, malloc'd, or NULL for nil. */
char *kt_str(const char *fmt, ...);

/* Child processes a test starts (capstan workers, private servers, Ruby):
 * kt_track remembers one (kt_capstan_start does it itself), kt_untrack forgets
 * one, and kt_kill_children — the suites' .fini — SIGKILLs and reaps every
 * one still running, so a failed assertion leaves nothing behind. */
pid_t kt_track(pid_t pid);
void kt_untrack(pid_t pid);
void kt_kill_children(void);

/* Runs the capstan binary: `capstan run -r <plugin> --redis-url <kt_url()> args...`
 * (args NULL-terminated), stdout+stderr to a log file. Returns its pid,
 * tracked for kt_kill_children. */
pid_t kt_capstan_start(const char *const *args);
/* The sharding tests' capstan: `capstan run -r <CAPSTAN_SHARDS_PLUGIN> -C
 * conf args...` with no REDIS_URL (the file's shards: give theirs) and the
 * plugin's ledger in ledger_dir (see kt_ledger_dir), its log where
 * kt_capstan_log reads it; tracked as kt_capstan_start's. */
pid_t kt_capstan_shards_start(const char *conf, const char *ledger_dir, const char *const *args);
/* n servers of the test's own (kt_aof_*, in folders dir1..dirn) started
 * and connected into c[0..n), and a capstan.yml (kt_write_conf) of head,
 * then a shards: list naming them s1..sn, then tail (NULL for none).
 * Returns the file's path, malloc'd. */
char *kt_shards_up(kt_aof_redis_t *s, redisContext **c, int n, const char *dir, const char *head, const char *tail);
/* One run the shards plugin's ledger records: "<jid> <port> <start>
 * <end>", the jid read as 8 hex digits of tag then 16 of i (kt_make_jid's
 * and the sharding tests' jids). */
typedef struct kt_ledger_run {
    unsigned tag;
    unsigned long long i;
    int port;
    long long start, end;
} kt_ledger_run_t;
/* The whole lines of the ledger in dir, malloc'd into *runs (a line still
 * being written is left for the next read). Returns how many parsed; *bad
 * counts those that did not. */
long kt_ledger_runs(const char *dir, kt_ledger_run_t **runs, long *bad);
/* A fresh folder for the shards plugin's ledger (its file "ledger" not
 * there yet), malloc'd. */
char *kt_ledger_dir(void);
/* Runs `capstan <args...>` to completion with output captured (malloc'd into
 * *out if out is not NULL). Returns the exit status, or -1. */
int kt_capstan_run(const char *const *args, char **out);
/* The log of a capstan started by kt_capstan_start, malloc'd. */
char *kt_capstan_log(pid_t pid);
/* Sends sig to pid and waits up to timeout seconds for it to exit.
 * Returns the exit status, 128+signal if killed, or -1 on timeout (then it
 * is killed with SIGKILL). */
int kt_capstan_stop(pid_t pid, int sig, double timeout);
/* The parent of process pid (from /proc), or -1. */
pid_t kt_parent_pid(pid_t pid);
/* Waits for pid to exit by itself, like kt_capstan_stop without a signal. */
int kt_wait_exit(pid_t pid, double timeout);

/* Runs `ruby tests/ruby/<script> args...` with REDIS_URL=kt_url(); stdout
 * captured into *out (malloc'd) when out is not NULL, stderr left on the
 * test's stderr. Returns exit status. */
int kt_ruby(const char *script, const char *const *args, char **out);

/* Ruby Sidekiq in several versions: Debian's 6.4.1 (the `sidekiq` and
 * `ruby` a test runs by default), and 7.3.10, 8.0.10 and 8.1.7 from the
 * tarballs in ../shared/vendor beside the repository (or $CAPSTAN_VENDOR),
 * which tests/vendor.sh unpacks once into the build directory
 * (KT_VENDOR_DIR). Where those sources are missing, a test of a vendored
 * version is skipped with one line saying so, never failed. */
#define KT_SIDEKIQ_DEBIAN "6.4.1"
/* Every version the interop tests know, oldest first, NULL-terminated
 * (whether or not their sources are here). */
const char *const *kt_sidekiq_versions(void);
/* Skips the test (cr_skip_test) when version's sources are not found;
 * fails it for a version kt_sidekiq_versions() does not list. kt_ruby_v
 * and kt_sidekiq_start_v call it themselves: call it first only to skip
 * before other work. */
void kt_sidekiq_need(const char *version);
/* The RUBYLIB that loads version ahead of Debian's gems ("" for Debian's
 * own; owned by the helpers); skips the test as kt_sidekiq_need does. */
const char *kt_sidekiq_rubylib(const char *version);
/* kt_ruby with Sidekiq version: for a vendored one the script runs with
 * its sources on RUBYLIB after tests/ruby/sidekiq_version.rb (8.x's Ruby
 * 3.2 shims, and a check that version is the Sidekiq loaded). The script sees
 * KT_SIDEKIQ_VERSION=version in every case. */
int kt_ruby_v(const char *version, const char *script, const char *const *args, char **out);
/* KT_SIDEKIQ_TEST(suite, name[, Test options]) { body }: one test per
 * version, name_6_4, name_7_3, name_8_0 and name_8_1, each running body with the
 * const char *sidekiq naming its version (for kt_ruby_v and
 * kt_sidekiq_start_v). */
#define KT_SIDEKIQ_TEST(suite, name, ...)                                                        \
    static void name##_with(const char *sidekiq);                                               \
    Test(suite, name##_6_4, ##__VA_ARGS__) { name##_with("6.4.1"); }                            \
    Test(suite, name##_7_3, ##__VA_ARGS__)                                                      \
    {                                                                                            \
        kt_sidekiq_need("7.3.10");                                                               \
        name##_with("7.3.10");                                                                   \
    }                                                                                            \
    Test(suite, name##_8_0, ##__VA_ARGS__)                                                      \
    {                                                                                            \
        kt_sidekiq_need("8.0.10");                                                               \
        name##_with("8.0.10");                                                                   \
    }                                                                                            \
    Test(suite, name##_8_1, ##__VA_ARGS__)                                                      \
    {                                                                                            \
        kt_sidekiq_need("8.1.7");                                                                \
        name##_with("8.1.7");                                                                    \
    }                                                                                            \
    static void name##_with(const char *sidekiq)

/* Polls cond every 20 ms for up to timeout seconds; true if it held. */
double kt_now(void);
/* Wall-clock time (CLOCK_REALTIME), seconds: what Redis and Sidekiq stamp. */
double kt_wall(void);
/* A capstan.yml in the test's temp dir with fast scheduler polls and beats
 * (an explicit poll_interval_average also skips the initial wait), then
 * extra (NULL for none). Caller frees the path. */
char *kt_write_conf(const char *extra);
#define KT_WAIT_UNTIL(cond, timeout_s) ({                       \
        double _end = kt_now() + (timeout_s);                   \
        bool _ok = false;                                       \
        while (!(_ok = (cond)) && kt_now() < _end)              \
            kt_sleep(0.02);                                     \
        _ok; })
void kt_sleep(double s);

/* The contents of a file, malloc'd and NUL-terminated ("" when missing). */
char *kt_read_file(const char *path);
/* A TCP port on 127.0.0.1 that nothing listens on right now. */
int kt_free_port(void);

/* A path under this test's private temp directory (malloc'd). */
char *kt_tmp(const char *name);
/* Writes body to kt_tmp(name); returns that path (malloc'd). */
char *kt_write_file(const char *name, const char *body);
/* A connected library connection (capstan_redis_t) to this test's database;
 * capstan_redis_free it. */
capstan_redis_t *kt_lib_redis(void);

/* An embedded runtime (capstan/runtime.h) on this test's database:
 * kt_config gives a configuration for it (concurrency processors), and
 * kt_runtime_start runs rt on a thread of its own; kt_runtime_end stops
 * it, checks that capstan_runtime_run returned 0, and frees it. */
struct capstan_config;
struct capstan_runtime;
struct capstan_config *kt_config(int concurrency);
void kt_runtime_start(struct capstan_runtime *rt);
void kt_runtime_end(struct capstan_runtime *rt);

/* The identity of the one capstan process of this test, once its first beat
 * is in "processes" (malloc'd; fails the test after 20 s). */
char *kt_wait_identity(pid_t pid);
/* The identity capstan process pid names in its start line (malloc'd; waits
 * for the line, fails the test after 10 s): for tests with several. */
char *kt_log_identity(pid_t pid);
/* The working list key of a process identity (malloc'd). */
char *kt_working_key(const char *identity);
/* Starts Debian's Ruby Sidekiq 6.4.1 with the job file tests/ruby/JOBS on
 * queue (-c 2, -t 5), its output in kt_tmp("sidekiq.log"), connected as
 * the fixture's admin user (Sidekiq runs INFO at boot). Tracked: it is
 * killed with the test's other children. */
pid_t kt_sidekiq_start(const char *jobs, const char *queue);
/* The same server in Sidekiq version (see kt_ruby_v; the job file sees
 * KT_SIDEKIQ_VERSION too). */
pid_t kt_sidekiq_start_v(const char *version, const char *jobs, const char *queue);
/* What that Sidekiq has written so far (malloc'd). */
char *kt_sidekiq_log(void);
/* GET /metrics from a capstan listening on 127.0.0.1:port: the response,
 * headers and body (malloc'd), or NULL when nothing answers. */
char *kt_scrape(int port);
/* Whether pid's log (kt_capstan_log) holds needle, and how many times. */
int kt_log_has(pid_t pid, const char *needle);
int kt_log_count(pid_t pid, const char *needle);
/* The pid of supervised worker slot as supervisor sup's log names it
 * last, or 0. */
pid_t kt_worker_pid(pid_t sup, int slot);
/* The message of the last line of a log (malloc'd): what follows its
 * level ("... tid=T ERROR: "), or the whole line when it has none. */
char *kt_last_line(const char *out);

/* A fresh 24-hex jid, unique within the test program (tag tells job kinds
 * apart, i the jobs of one kind). */
void kt_make_jid(char out[25], unsigned tag, unsigned i);
/* A job as Sidekiq 7's client writes it (malloc'd). */
char *kt_payload(const char *cls, const char *args, const char *jid, const char *queue);
/* kt_payload with v9's lock fields: lock (a lock type) and the lock_digest
 * "uniquejobs:<key>", so that jobs share a lock only when they share key. */
char *kt_payload_locked(const char *cls, const char *args, const char *jid, const char *queue,
                        const char *lock, const char *key);
/* LPUSHes n payloads to queue:NAME on c in batches of 1,000, as a bulk
 * client would (p[0] is fetched first), and adds NAME to "queues". */
void kt_push_all(redisContext *c, const char *queue, char **p, size_t n);
/* Pushes n jobs of cls with args to queue:default, jids kt_make_jid(tag,
 * 0 .. n-1), the first fetched first. */
void kt_push_jobs(const char *cls, const char *args, unsigned tag, size_t n);
/* Whether the working list of a process identity holds the job jid. */
int kt_working_has(const char *identity, const char *jid);

/* Runs, in a child that takes SIGPIPE's default action (death), as a
 * program that never heard of the signal does: a client on url whose
 * connection the server then closes (CLIENT KILL, sent on the plain port
 * kill_port of the same server), and a commit of 2,000 pushes (4 MB, more
 * than a socket takes at once) after that. Returns the child's status as
 * kt_wait_exit does: 0 when the commit failed with CAPSTAN_EREDIS, 128 +
 * SIGPIPE when the library let the signal reach the program, another code
 * for a step that went wrong (see helpers.c). */
int kt_commit_after_client_kill(const char *url, int kill_port);

/* Every test program linked with the helpers (link_whole) starts the
 * server in a PRE_ALL hook and stops it in POST_ALL (helpers.c). */

#endif
