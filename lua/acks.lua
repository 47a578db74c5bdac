-- uses: release_hold
-- Finish several successful jobs at once: each leaves the working list and,
-- when it holds a uniqueness lock, its jid's hold on "<digest>:LOCKED" goes
-- in the same step, as in ack.lua. A job no longer in the list (requeued or
-- recovered meanwhile) keeps its lock, for the copy that will run. One
-- script call for a batch instead of a command per job: the per-command
-- cost, not the removal, is most of what an ack costs Redis.
-- KEYS[1] working list, KEYS[2] "uniquejobs:digests".
-- ARGV: triples of payload as fetched, "<digest>:LOCKED" ("" without a
-- lock), jid.
-- Returns how many of the jobs were still in the working list.
local working, digests = KEYS[1], KEYS[2]
local removed = 0
for i = 1, #ARGV, 3 do
  -- From the tail, where the oldest (first finished) jobs are.
  if redis.call('LREM', working, -1, ARGV[i]) == 1 then
    removed = removed + 1
    if ARGV[i + 1] ~= '' then
      release_hold(ARGV[i + 1], digests, ARGV[i + 2])
    end
  end
end
return removed
