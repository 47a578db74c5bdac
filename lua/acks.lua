-- uses: take_out
-- uses: batch_done
-- uses: wake_waiters
-- Finish several successful jobs at once: each leaves the working list and,
-- in the same step, when it holds a uniqueness lock its jid's hold on
-- "<digest>:LOCKED" goes, as in ack.lua, and when it belongs to a batch the
-- batch counts it, as lib/batch_done.lua says (each batch's counters move
-- once per call). A job no longer in the list (requeued or recovered
-- meanwhile) keeps its until-lock and counts nothing, for the copy that
-- will run; a runtime lock (":RUN:LOCKED") is this run's own and goes.
-- One script call for a batch of acks instead of a command per job: the
-- per-command cost, not the removal, is most of what an ack costs Redis.
-- KEYS[1] working list, KEYS[2] "uniquejobs:digests", then, declared for
-- the jobs' groups below (which name them again): each lock hash with its
-- waiters' "<key>:WAITING" and "<key>:WAKE" (lib/wake_waiters.lua), in the
-- order of the groups that name a lock, then each batch's "batch:BID",
-- "batch:BID:jids" and "batch:BID:failures", and with a batch
-- "batches:open" and "queues" (a parent's keys and the callbacks' queues,
-- read from a batch, cannot be declared: doc/internals.md).
-- ARGV[1] one byte a job: "1" when it holds a lock (its three keys are the
-- next in KEYS), "0" when not; then groups of 3: payload as fetched, jid,
-- bid ("" without a batch). (Each argument costs Redis more than a
-- command's work on it: the lock's hash is named once, in KEYS.)
-- Returns {how many of the jobs were still in the working list, the flags
-- of lib/batch_done.lua (2: a bid named no batch; the callbacks fired), that
-- bid or ""}.
local keys, argv = KEYS, ARGV
local working, digests = keys[1], keys[2]
local removed, flags, acc, unknown = 0, 0, {}, ''
local kinds = argv[1]
local take = take_out(working, argv, 3, 2)
-- The holds dropped, with their waiters' lines: whether a hash was left
-- empty, and whether anyone waits, is asked of them all at once below.
-- (A command, or a Lua step, a job costs Redis more than the command's
-- own work: the loop does as few of them as it can.)
local held, lines, wakes, n, k = {}, {}, {}, 0, 3
for j = 1, #kinds do
  local i = 3 * j - 1
  local lock = string.byte(kinds, j) == 49 and keys[k]
  if take(argv[i]) then
    removed = removed + 1
    if argv[i + 2] ~= '' and batch_ok(acc, argv[i + 2], argv[i + 1]) == 2 then
      flags, unknown = 2, argv[i + 2]
    end
  elseif lock and not string.find(lock, ':RUN:LOCKED', -11, true) then
    -- A late ack keeps its until-lock; its runtime lock is this run's own
    -- and goes (see ack.lua).
    lock, k = false, k + 3
  end
  if lock then
    if redis.call('HDEL', lock, argv[i + 1]) == 1 then
      n = n + 1
      held[n], lines[n], wakes[n] = lock, keys[k + 1], keys[k + 2]
    end
    k = k + 3
  end
end
if n > 0 then
  -- As lib/release_hold.lua: a hash with no holder left is gone, and so is
  -- its digest from the index. Usually none has one left.
  local any, rem = redis.call('EXISTS', unpack(held)) > 0, {}
  for j = 1, n do
    if not any or redis.call('HLEN', held[j]) == 0 then
      local l = held[j]
      rem[#rem + 1] = string.find(l, ':LOCKED', -7, true) and string.sub(l, 1, -8) or l
    end
  end
  if #rem > 0 then
    redis.call('ZREM', digests, unpack(rem))
  end
  -- As lib/wake_waiters.lua, best effort: usually no one waits.
  if redis.pcall('EXISTS', unpack(lines)) ~= 0 then
    for j = 1, n do
      pcall(wake_line, lines[j], wakes[j])
    end
  end
end
return { removed, flags + batch_flush(acc), unknown }
