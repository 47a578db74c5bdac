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
-- the jobs below (which name them again): each lock hash, with its
-- waiters' "<key>:WAITING" and "<key>:WAKE" after it when someone may wait
-- for it (lib/wake_waiters.lua), in the jobs' order, then each batch's
-- "batch:BID", "batch:BID:jids" and "batch:BID:failures", and with a batch
-- "batches:open" and "queues" (a parent's keys and the callbacks' queues,
-- read from a batch, cannot be declared: doc/internals.md).
-- ARGV[1] one byte a job, what it has (SHAPES below): "0" no lock and no
-- batch, "b" a batch, "l" a lock (its hash is the next in KEYS), "w" a lock
-- with its waiters' two keys after it (a job whose lock has a
-- lock_timeout: only those wait), "L" and "W" as "l" and "w" with a batch.
-- Then each job's jid, when it has a lock or a batch, and its bid, when a
-- batch, in the jobs' order; then the payloads as fetched, in the same
-- order. (Each argument costs Redis more than a command's work on it: a
-- job sends only what it has, and the lock's hash is named once, in KEYS.)
-- Returns {how many of the jobs were still in the working list, the flags
-- of lib/batch_done.lua (2: a bid named no batch; the callbacks fired), that
-- bid or ""}.
local keys, argv = KEYS, ARGV
local working, digests = keys[1], keys[2]
local removed, flags, acc, unknown = 0, 0, {}, ''
local kinds = argv[1]
local jobs = #kinds
local first = #argv - jobs + 1
local take = take_out(working, argv, 1, first)
-- A job's shape: how many keys its lock has in KEYS, whether it has a bid.
local SHAPES = { [48] = { 0, false }, [98] = { 0, true }, [108] = { 1, false }, [76] = { 1, true },
                 [119] = { 3, false }, [87] = { 3, true } }
-- The holds dropped, with their waiters' lines: whether a hash was left
-- empty, and whether anyone waits, is asked of them all at once below.
-- (A command, or a Lua step, a job costs Redis more than the command's
-- own work: the loop does as few of them as it can.)
local held, lines, wakes, n, w, k, a = {}, {}, {}, 0, 0, 3, 2
for j = 1, jobs do
  local shape = SHAPES[string.byte(kinds, j)]
  local nk, jid, bid = shape[1], nil, nil
  if nk > 0 or shape[2] then
    jid, a = argv[a], a + 1
  end
  if shape[2] then
    bid, a = argv[a], a + 1
  end
  local lock = nk > 0 and keys[k]
  if take(argv[first + j - 1]) then
    removed = removed + 1
    if bid and batch_ok(acc, bid, jid) == 2 then
      flags, unknown = 2, bid
    end
  elseif lock and not string.find(lock, ':RUN:LOCKED', -11, true) then
    -- A late ack keeps its until-lock; its runtime lock is this run's own
    -- and goes (see ack.lua).
    lock = false
  end
  if lock and redis.call('HDEL', lock, jid) == 1 then
    n = n + 1
    held[n] = lock
    if nk == 3 then
      w = w + 1
      lines[w], wakes[w] = keys[k + 1], keys[k + 2]
    end
  end
  k = k + nk
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
end
-- As lib/wake_waiters.lua, best effort: usually no one waits.
if w > 0 and redis.pcall('EXISTS', unpack(lines)) ~= 0 then
  for j = 1, w do
    pcall(wake_line, lines[j], wakes[j])
  end
end
return { removed, flags + batch_flush(acc), unknown }
