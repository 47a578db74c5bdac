/* `capstan lock`: run a command while holding a queued (FIFO) lock, as flock(1)
 * does for one machine, plus a look at the locks (info, list) and the
 * clean-up of dead requests. The lease is refreshed while the command runs,
 * so a command may outlive --ttl; if the lock is lost anyway (Redis out of
 * reach for a whole ttl, or capstan lock frozen past it) the command is stopped
 * rather than left running unprotected: SIGTERM, then SIGKILL after a short
 * grace, since a command that ignores SIGTERM would otherwise run on beside
 * the next holder for as long as it likes. If capstan lock itself dies, even by
 * SIGKILL, the kernel kills the command (PR_SET_PDEATHSIG) before its lease
 * can lapse. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "redis/keys.h"
#include "support/number.h"
#include "support/identity.h"
#include "support/time.h"
#include "capstan/qlock.h"
#include "capstan/redis.h"

#define EXIT_NOT_OBTAINED 75 /* EX_TEMPFAIL: try again later */
#define EXIT_LOST 70         /* EX_SOFTWARE: the lock went away under the command */
#define EXIT_REDIS 69        /* EX_UNAVAILABLE */
#define MAX_META 32
/* Seconds between SIGTERM and SIGKILL once the lock is lost: long enough
 * for a command to clean up after itself, short because it overlaps the
 * next holder all that time. */
#define KILL_AFTER_DEFAULT 5.0
/* Every second of grace is a second beside the next holder; a larger value
 * is most likely milliseconds typed for seconds (--ttl takes MS). */
#define KILL_AFTER_MAX 300.0

static const char *usage =
    "Usage: capstan lock NAME [options] -- COMMAND [ARGS...]\n"
    "       capstan lock info NAME\n"
    "       capstan lock list [--json]\n"
    "       capstan lock clear-dead [--dead-ttl MS]\n"
    "\n"
    "Runs COMMAND while holding the queued lock NAME: callers on any machine get\n"
    "it one at a time, in the order they asked (redis_queued_locks' keys, so Ruby\n"
    "processes using that gem take turns too). The lease is refreshed every ttl/3\n"
    "while COMMAND runs. COMMAND sees CAPSTAN_LOCK_NAME and CAPSTAN_LOCK_FENCE (a fencing\n"
    "token larger than that of every earlier holder of NAME).\n"
    "\n"
    "  --ttl MS            lease; refreshed while COMMAND runs (default 10000)\n"
    "  --timeout S         stop waiting after S seconds (default: wait forever)\n"
    "  --queue-ttl S       a waiter silent this long loses its place (default 15)\n"
    "  --retry-delay MS    pause between attempts (default 200, plus up to 1/8 jitter)\n"
    "  --fail-fast         give up at once when the lock is held\n"
    "  --kill-after S      once the lock is lost, SIGKILL COMMAND S seconds after\n"
    "                      its SIGTERM (default 5, at most 300; 0: at once)\n"
    "  --meta FIELD=VALUE  store in the lock (repeatable; default host=HOSTNAME)\n"
    "  -v, --verbose       log every attempt to stderr\n"
    "      --redis-url URL default: FILE's, else $REDIS_URL, else\n"
    "                      redis://127.0.0.1:6379/0\n"
    "  -C, --config FILE   read redis_url, or the shards: list, from FILE (-e ENV:\n"
    "                      its section); with shards, NAME is in the rendezvous\n"
    "                      pick of its name among every shard, for the lock and\n"
    "                      info; list and clear-dead need --shard NAME\n"
    "      --shard NAME    with FILE's shards: list, that shard\n"
    "  -h, --help          this help\n"
    "\n"
    "info prints the lock and its queue as JSON; list shows every lock and\n"
    "queue; clear-dead drops requests older than --dead-ttl (default one day)\n"
    "whose waiter no longer tries. A lock named info, list or clear-dead needs\n"
    "the `--` form.\n"
    "\n"
    "Exit status: COMMAND's (128+N when a signal N ended it); 75 when the lock\n"
    "was not obtained (timeout or --fail-fast); 70 when the lock was lost while\n"
    "COMMAND ran (COMMAND gets SIGTERM, then SIGKILL after --kill-after); 69 when\n"
    "Redis failed; 64 for bad usage; 126/127 when COMMAND cannot be run.\n"
    "\n"
    "A lost lock may already be someone else's: between the lease's end and\n"
    "COMMAND's exit (how long capstan lock was frozen or cut off, then up to\n"
    "--kill-after) both run. CAPSTAN_LOCK_FENCE guards that window: a resource\n"
    "that refuses writes with a token lower than the last one it saw is safe.\n"
    "\n"
    "If capstan lock dies (even by kill -9), COMMAND is killed with it (SIGKILL), so\n"
    "it does not run on after capstan lock. Processes COMMAND started are not: a\n"
    "shell COMMAND should `exec` its last program or wait for its children.\n";

enum { OPT_TTL = 1000, OPT_TIMEOUT, OPT_QTTL, OPT_DELAY, OPT_FAILFAST, OPT_META, OPT_URL, OPT_SHARD,
       OPT_JSON, OPT_DEADTTL, OPT_KILLAFTER };

struct lock_args {
    capstan_qlock_opts_t o;
    capstan_cli_fleet_t f; /* --redis-url, -C, -e, --shard */
    int verbose, json;
    long long dead_ttl;
    double kill_after;
    const char *meta[2 * MAX_META + 3];
    char *meta_buf[MAX_META];
    int nmeta_buf;
};

static volatile sig_atomic_t child_pid;
static volatile sig_atomic_t got_signal;

static void forward(int sig)
{
    got_signal = sig;
    if (child_pid > 0)
        kill((pid_t)child_pid, sig);
}

static void log_stderr(const char *line, void *udata)
{
    (void)udata;
    fprintf(stderr, "capstan lock: %s\n", line);
}

static int num(const char *flag, const char *v, double min, double *out)
{
    /* 1e12 ms or s is past any sane lease or wait, and far from the
     * overflow of the integer fields the values go to. */
    if (capstan__parse_number(v, 0, min, 1e12, out)) {
        fprintf(stderr, "capstan lock: %s: not a valid number: %s\n", flag, v);
        return -1;
    }
    return 0;
}

/* Parses options in argv[0..argc) (argv[0] is the command word). Returns
 * -1 to exit 0 (help), a positive exit status on bad usage, else 0. */
static int parse(int argc, char **argv, struct lock_args *a)
{
    static const struct option longopts[] = {
        { "ttl", required_argument, NULL, OPT_TTL }, { "timeout", required_argument, NULL, OPT_TIMEOUT },
        { "queue-ttl", required_argument, NULL, OPT_QTTL },
        { "retry-delay", required_argument, NULL, OPT_DELAY },
        { "fail-fast", no_argument, NULL, OPT_FAILFAST }, { "meta", required_argument, NULL, OPT_META },
        { "redis-url", required_argument, NULL, OPT_URL }, { "json", no_argument, NULL, OPT_JSON },
        { "dead-ttl", required_argument, NULL, OPT_DEADTTL },
        { "kill-after", required_argument, NULL, OPT_KILLAFTER },
        { "verbose", no_argument, NULL, 'v' }, { "help", no_argument, NULL, 'h' },
        { "config", required_argument, NULL, 'C' }, { "environment", required_argument, NULL, 'e' },
        { "shard", required_argument, NULL, OPT_SHARD },
        { NULL, 0, NULL, 0 },
    };
    int opt, nmeta = 0;
    double d;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "vhC:e:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': a->f.conf = optarg; break;
        case 'e': a->f.env = optarg; break;
        case OPT_SHARD: a->f.shard = optarg; break;
        case OPT_TTL:
            if (num("--ttl", optarg, 1, &d)) return CAPSTAN_EXIT_USAGE;
            a->o.ttl = (long long)d;
            break;
        case OPT_TIMEOUT:
            if (num("--timeout", optarg, 0, &d)) return CAPSTAN_EXIT_USAGE;
            a->o.timeout = d;
            break;
        case OPT_QTTL:
            if (num("--queue-ttl", optarg, 0.001, &d)) return CAPSTAN_EXIT_USAGE;
            a->o.queue_ttl = d;
            break;
        case OPT_DELAY:
            if (num("--retry-delay", optarg, 0, &d)) return CAPSTAN_EXIT_USAGE;
            a->o.retry_delay = (long)d;
            a->o.retry_jitter = (long)d / 8;
            break;
        case OPT_DEADTTL:
            if (num("--dead-ttl", optarg, 0, &d)) return CAPSTAN_EXIT_USAGE;
            a->dead_ttl = (long long)d;
            break;
        case OPT_KILLAFTER:
            if (capstan__parse_number(optarg, 0, 0, KILL_AFTER_MAX, &a->kill_after)) {
                fprintf(stderr, "capstan lock: --kill-after: expected seconds from 0 to %g: %s\n", KILL_AFTER_MAX,
                        optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            break;
        case OPT_FAILFAST: a->o.fail_fast = 1; break;
        case OPT_URL: a->f.url = optarg; break;
        case OPT_JSON: a->json = 1; break;
        case 'v': a->verbose = 1; break;
        case OPT_META: {
            const char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || nmeta >= MAX_META) {
                fprintf(stderr, "capstan lock: --meta: expected FIELD=VALUE (at most %d): %s\n", MAX_META, optarg);
                return CAPSTAN_EXIT_USAGE;
            }
            char *field = strndup(optarg, (size_t)(eq - optarg));
            a->meta_buf[a->nmeta_buf++] = field;
            a->meta[2 * nmeta] = field;
            a->meta[2 * nmeta + 1] = eq + 1;
            nmeta++;
            break;
        }
        case 'h': fputs(usage, stdout); return -1;
        default:
            fprintf(stderr, "capstan lock: %s: unknown option or missing value\n\n%s", argv[optind - 1], usage);
            return CAPSTAN_EXIT_USAGE;
        }
    }
    a->meta[2 * nmeta] = NULL;
    return 0;
}

static int cmd_info(capstan_redis_t *r, const char *name)
{
    char err[CAPSTAN_ERRLEN];
    json_t *info = NULL, *queue = NULL;
    if (capstan_qlock_info(r, name, &info, err) || capstan_qlock_queue_info(r, name, &queue, err)) {
        fprintf(stderr, "capstan lock info: %s\n", err);
        json_decref(info);
        return EXIT_REDIS;
    }
    json_t *q = queue ? json_incref(json_object_get(queue, "queue")) : json_array();
    json_t *out = json_pack("{s:s, s:o, s:o}", "name", name, "lock", info ? info : json_null(), "queue", q);
    json_dumpf(out, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    putchar('\n');
    json_decref(out);
    json_decref(queue);
    return 0;
}

static int cmd_list(capstan_redis_t *r, int as_json)
{
    char err[CAPSTAN_ERRLEN];
    json_t *locks = NULL, *queues = NULL, *v;
    size_t i;
    int rc = EXIT_REDIS;
    if (capstan_qlock_locks_info(r, 0, &locks, err) || capstan_qlock_queues_info(r, 0, &queues, err)) {
        fprintf(stderr, "capstan lock list: %s\n", err);
        goto out;
    }
    rc = 0;
    if (as_json) {
        json_t *o = json_pack("{s:O, s:O}", "locks", locks, "queues", queues);
        json_dumpf(o, stdout, JSON_INDENT(2));
        putchar('\n');
        json_decref(o);
        goto out;
    }
    /* One line per name, whether it is held, waited for, or both. */
    json_t *names = json_object();
    json_array_foreach(locks, i, v) {
        const char *key = json_string_value(json_object_get(v, "lock"));
        json_object_set_new(names, key + strlen(CAPSTAN_KEY_QLOCK),
                            json_pack("{s:O}", "info", json_object_get(v, "info")));
    }
    json_array_foreach(queues, i, v) {
        const char *key = json_string_value(json_object_get(v, "queue"))
                          + strlen(CAPSTAN_KEY_QLOCK_QUEUE);
        if (!json_object_get(names, key))
            json_object_set_new(names, key, json_object());
        json_object_set(json_object_get(names, key), "requests", json_object_get(v, "requests"));
    }
    const char *name;
    json_object_foreach(names, name, v) {
        json_t *info = json_object_get(v, "info");
        const char *holder = json_string_value(json_object_get(info, "acq_id"));
        printf("%s\t%s\trem_ttl=%lld\tfence=%lld\twaiting=%zu\n", name, holder ? holder : "-",
               (long long)json_integer_value(json_object_get(info, "rem_ttl")),
               (long long)json_integer_value(json_object_get(info, "capstan_fence")),
               json_array_size(json_object_get(v, "requests")));
    }
    json_decref(names);
out:
    json_decref(locks);
    json_decref(queues);
    return rc;
}

static int cmd_clear_dead(capstan_redis_t *r, long long dead_ttl)
{
    char err[CAPSTAN_ERRLEN];
    json_t *done = NULL;
    long long n = 0;
    if (capstan_qlock_clear_dead_requests(r, dead_ttl, 0, &done, &n, err)) {
        fprintf(stderr, "capstan lock clear-dead: %s\n", err);
        return EXIT_REDIS;
    }
    printf("dropped %lld dead requests from %zu queues\n", n, json_array_size(done));
    json_decref(done);
    return 0;
}

static int status_of(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
}

/* Runs cmd under the held lock, refreshing the lease; returns the exit
 * status. Once the lock is lost, cmd gets SIGTERM, and SIGKILL kill_after
 * seconds later if it is still there. */
static int run_held(capstan_redis_t *r, capstan_qlock_result_t *held, char **cmd, double kill_after)
{
    char fence[32], err[CAPSTAN_ERRLEN];
    snprintf(fence, sizeof(fence), "%lld", held->fence);
    struct sigaction sa = { .sa_handler = forward };
    sigemptyset(&sa.sa_mask);
    int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT };
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "capstan lock: fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        /* Nothing refreshes the lease once capstan lock is gone, so COMMAND must
         * not outlive it, even a kill -9: the kernel kills it then. Had the
         * parent died before this call, nobody would send the signal. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(EXIT_LOST);
        setenv("CAPSTAN_LOCK_NAME", held->name, 1);
        setenv("CAPSTAN_LOCK_FENCE", fence, 1);
        execvp(cmd[0], cmd);
        int e = errno;
        fprintf(stderr, "capstan lock: %s: %s\n", cmd[0], strerror(e));
        _exit(e == ENOENT ? 127 : 126);
    }
    child_pid = pid;
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaction(sigs[i], &sa, NULL);

    double period = (double)held->ttl / 3000.0;
    double next = capstan__mono() + period;
    int st = 0, lost = 0, killed = 0;
    double kill_at = 0;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            st = 1 << 8;
            break;
        }
        if (!lost && capstan__mono() >= next) {
            if (!capstan_redis_ok(r))
                capstan_redis_connect(r);
            int rc = capstan_qlock_extend(r, held, held->ttl, 1, NULL, err);
            if (rc == CAPSTAN_EDENIED || (rc && capstan__mono() >= held->deadline)) {
                fprintf(stderr, "capstan lock: lost the lock %s while %s ran (%s); stopping it "
                        "(SIGTERM, SIGKILL in %g s)\n",
                        held->name, cmd[0], rc == CAPSTAN_EDENIED ? "taken or expired" : err, kill_after);
                lost = 1;
                kill_at = capstan__mono() + kill_after;
                kill(pid, SIGTERM);
            }
            /* After a failed refresh, try again soon: the lease still runs. */
            next = capstan__mono() + (rc ? period / 4 : period);
        }
        if (lost && !killed && capstan__mono() >= kill_at) {
            fprintf(stderr, "capstan lock: %s still ran %g s after SIGTERM; killing it (SIGKILL)\n", cmd[0],
                    kill_after);
            killed = 1;
            kill(pid, SIGKILL);
        }
        capstan__sleep(0.005);
    }
    child_pid = 0;
    if (lost)
        return EXIT_LOST;
    int rc = capstan_qlock_release(NULL, r, held, err);
    if (rc)
        fprintf(stderr, "capstan lock: releasing %s: %s\n", held->name, err);
    return status_of(st);
}

int capstan__cmd_lock(int argc, char **argv)
{
    struct lock_args a = { .o = capstan_qlock_opts_default(), .dead_ttl = -1, .kill_after = KILL_AFTER_DEFAULT };
    a.o.ttl = 10000;
    a.o.timeout = CAPSTAN_QLOCK_UNLIMITED;
    a.o.retry_count = CAPSTAN_QLOCK_UNLIMITED;
    capstan_redis_t *r = NULL;
    capstan_qlock_client_t *c = NULL;
    char err[CAPSTAN_ERRLEN];
    int status = CAPSTAN_EXIT_USAGE;

    int dd = 0; /* index of "--" */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) {
            dd = i;
            break;
        }
    int rc = parse(dd ? dd : argc, argv, &a);
    if (rc) {
        status = rc < 0 ? 0 : rc;
        goto out;
    }
    /* getopt moved the operands to the end of the parsed range. */
    int nops = (dd ? dd : argc) - optind;
    char **ops = argv + optind;
    /* With shards, a lock NAME is in the rendezvous pick of its name among
     * every shard, where each capstan lock of the same file meets. */
    const char *url = NULL, *shard;
    const char *keyed = dd ? (nops > 0 ? ops[0] : NULL) : nops == 2 && !strcmp(ops[0], "info") ? ops[1] : NULL;
    rc = capstan__cli_fleet_load("capstan lock", &a.f);
    if (rc < 0)
        rc = capstan__cli_fleet_one("capstan lock", &a.f, keyed ? CAPSTAN_CLI_PICK_ALL : CAPSTAN_CLI_PICK_NONE,
                                    keyed, &url, &shard);
    if (rc >= 0) {
        status = rc;
        goto out;
    }
    if (!dd) {
        const char *sub = nops > 0 ? ops[0] : "";
        int failed = EXIT_REDIS;
        if (strcmp(sub, "info") == 0 && nops == 2) {
            status = (r = capstan__cli_connect("capstan lock", url, &failed)) ? cmd_info(r, ops[1]) : failed;
        } else if (strcmp(sub, "list") == 0 && nops == 1) {
            status = (r = capstan__cli_connect("capstan lock", url, &failed)) ? cmd_list(r, a.json) : failed;
        } else if (strcmp(sub, "clear-dead") == 0 && nops == 1) {
            status = (r = capstan__cli_connect("capstan lock", url, &failed)) ? cmd_clear_dead(r, a.dead_ttl)
                                                                             : failed;
        } else {
            fprintf(stderr, "capstan lock: expected NAME [options] -- COMMAND, info NAME, list or clear-dead\n\n%s",
                    usage);
        }
        goto out;
    }
    if (nops != 1 || dd + 1 >= argc) {
        fprintf(stderr, "capstan lock: expected NAME [options] -- COMMAND [ARGS...]\n\n%s", usage);
        goto out;
    }
    const char *name = ops[0];
    char host[256];
    if (!a.meta[0]) {
        capstan__hostname(host, sizeof(host));
        a.meta[0] = "host";
        a.meta[1] = host;
        a.meta[2] = NULL;
    }
    a.o.meta = a.meta;
    if (!(c = capstan_qlock_client_new(NULL, err))) {
        fprintf(stderr, "capstan lock: %s\n", err);
        status = 1;
        goto out;
    }
    if (a.verbose)
        capstan_qlock_client_on_log(c, log_stderr, NULL, 1);
    status = EXIT_REDIS;
    if (!(r = capstan__cli_connect("capstan lock", url, &status)))
        goto out;
    capstan_qlock_result_t held;
    rc = capstan_qlock_lock(c, r, name, &a.o, &held, err);
    if (rc == CAPSTAN_EDENIED) {
        fprintf(stderr, "capstan lock: %s: not obtained (%s)\n", name, capstan_qlock_status_name(held.status));
        status = EXIT_NOT_OBTAINED;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "capstan lock: %s\n", err);
        status = rc == CAPSTAN_EINVAL ? CAPSTAN_EXIT_USAGE : EXIT_REDIS;
        goto out;
    }
    status = run_held(r, &held, argv + dd + 1, a.kill_after);
out:
    for (int i = 0; i < a.nmeta_buf; i++)
        free(a.meta_buf[i]);
    capstan_qlock_client_free(c);
    capstan_redis_free(r);
    capstan__cli_fleet_free(&a.f);
    return status;
}
