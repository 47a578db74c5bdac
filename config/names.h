/* The one rule for queue names, whichever way a name comes in: the queues:
 * setting, `capstan run -q`, a class's queue: and `capstan push --queue`, so that
 * no command writes to a queue ("queue:" or "queue:a b") that a worker
 * could never be told to read. Not public. */
#ifndef CAPSTAN_CONFIG_NAMES_H
#define CAPSTAN_CONFIG_NAMES_H

/* 0 when name can be a queue's; otherwise CAPSTAN_ECONFIG with err saying why
 * ("a queue name is empty", "queue name \"a b\" contains a space"). */
int capstan__config_queue_name_check(const char *name, char *err);

#endif
