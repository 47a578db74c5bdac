-- uses: release_hold
-- uses: fits
-- uses: batch_done
-- uses: wake_waiters
-- Finish a job: drop it from the working list and write its failure (retry
-- or dead) in one step, so a crash between the two can neither lose nor
-- double it. With a working list, the failure is written only if the job
-- was still there: a job requeued at shutdown or recovered from a process
-- presumed dead is not written a second time by a late ack.
-- KEYS[1] working list ("" with the basic fetch), KEYS[2] retry or dead zset
-- (or, for "queue", the job's queue list),
-- KEYS[3] and KEYS[4] (optional) a uniqueness lock "<digest>:LOCKED" and
-- "uniquejobs:digests": the job's hold on it is released in the same step,
-- so a lock outlives its job neither after a crash between the two nor
-- when a late ack finds the job recovered (then an until-lock stays with
-- it; a runtime lock, taken by this run, goes).
-- ARGV[1] payload as fetched, ARGV[2] "ok" | "retry" | "dead" | "drop" |
-- "queue" (an interrupted iterable job: ARGV[4] goes to the end of its
-- queue, as Sidekiq's re-push puts it),
-- ARGV[3] zset score, ARGV[4] payload to store,
-- ARGV[5] dead cutoff score (older entries are trimmed), ARGV[6] dead_max_jobs,
-- ARGV[7] the jid whose hold on KEYS[3] is released.
-- With a batch (the job's "bid"), KEYS[3] and KEYS[4] are "" when there is
-- no lock, KEYS[5] is "batch:BID", KEYS[6..9] "batch:BID:jids",
-- "batch:BID:failures", "batches:open" and "queues" (declared for
-- lib/batch_done.lua, which names them itself; a parent's keys and the
-- callbacks' queues cannot be: doc/internals.md), ARGV[8] the bid, ARGV[9] the jid and
-- ARGV[10] the outcome for the batch ("s", "f", "d", or "" for none): the
-- batch moves in the same step as the job leaves the working list, and only
-- then, so a late or repeated ack never counts (lib/batch_done.lua).
-- With a lock, two more KEYS come last: its "<key>:WAITING" and "<key>:WAKE",
-- declared for lib/wake_waiters.lua.
-- Returns 1 when the job was acked (0 when it was no longer in the working
-- list), plus batch_done's flags.
local mode = ARGV[2]
-- A retry or dead key of another type would refuse the ZADD after the LREM
-- (a script is not rolled back) and the job would be lost: refuse first,
-- and the job stays in the working list.
if mode == 'retry' or mode == 'dead' or mode == 'queue' then
  local want = mode == 'queue' and 'list' or 'zset'
  local ok, t = fits(KEYS[2], want)
  if not ok then
    return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' is a ' .. t .. ', not a ' ..
      (want == 'list' and 'list' or 'sorted set'))
  end
end
local removed = 1
if KEYS[1] ~= '' then
  -- From the tail, where the oldest (first finished) jobs are.
  removed = redis.call('LREM', KEYS[1], -1, ARGV[1])
  if removed == 0 then
    -- A late ack: the job went back or to another process meanwhile and
    -- keeps its until-lock for that copy. A runtime lock is this run's
    -- own (the copy takes its own when it runs), so it goes, or nothing
    -- would ever release a hold this run took after the copy finished.
    if KEYS[4] and KEYS[4] ~= '' and ARGV[7] and string.sub(KEYS[3], -11) == ':RUN:LOCKED'
        and release_hold(KEYS[3], KEYS[4], ARGV[7]) then
      wake_waiters(KEYS[3])
    end
    return 0
  end
end
if mode == 'retry' then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
elseif mode == 'queue' then
  redis.call('LPUSH', KEYS[2], ARGV[4])
elseif mode == 'dead' then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[5])
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -tonumber(ARGV[6]) - 1)
end
if KEYS[4] and KEYS[4] ~= '' and ARGV[7] and release_hold(KEYS[3], KEYS[4], ARGV[7]) then
  wake_waiters(KEYS[3])
end
if ARGV[10] and ARGV[10] ~= '' then
  return removed + batch_done(ARGV[8], ARGV[9], ARGV[10], ARGV[4])
end
return removed
