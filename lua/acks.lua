-- uses: zset_batch
-- uses: take_out
-- uses: release_hold
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
-- waiters' "<key>:WAITING" and "<key>:WAKE" (lib/wake_waiters.lua), each
-- batch's "batch:BID", "batch:BID:jids" and "batch:BID:failures", and with
-- a batch "batches:open" and "queues" (a parent's keys and the callbacks'
-- queues, read from a batch, cannot be declared: doc/internals.md).
-- ARGV: groups of 4: payload as fetched, "<digest>:LOCKED" ("" without a
-- lock), jid, bid ("" without a batch).
-- Returns {how many of the jobs were still in the working list, the flags
-- of lib/batch_done.lua (2: a bid named no batch; the callbacks fired), that
-- bid or ""}.
local working, digests = KEYS[1], KEYS[2]
local removed, flags, acc, unknown, z = 0, 0, {}, '', {}
local take = take_out(working, ARGV, 4)
for i = 1, #ARGV, 4 do
  if take(ARGV[i]) then
    removed = removed + 1
    if ARGV[i + 1] ~= '' and release_hold(ARGV[i + 1], digests, ARGV[i + 2], z) then
      wake_waiters(ARGV[i + 1])
    end
    if ARGV[i + 3] ~= '' and batch_ok(acc, ARGV[i + 3], ARGV[i + 2]) == 2 then
      flags, unknown = 2, ARGV[i + 3]
    end
  elseif string.sub(ARGV[i + 1], -11) == ':RUN:LOCKED' then
    -- A late ack's runtime lock is this run's own: it goes (see ack.lua).
    if release_hold(ARGV[i + 1], digests, ARGV[i + 2], z) then
      wake_waiters(ARGV[i + 1])
    end
  end
end
zset_flush(z, digests)
return { removed, flags + batch_flush(acc), unknown }
