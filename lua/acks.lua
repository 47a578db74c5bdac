-- uses: release_hold
-- Finish several successful jobs at once, each releasing its uniqueness
-- lock as ack.lua does: the job leaves the working list and its jid's hold
-- on "<digest>:LOCKED" goes in the same step; a job no longer in the list
-- (requeued or recovered meanwhile) keeps its lock, for the copy that will
-- run. One script call for a batch instead of one per job.
-- KEYS[1] working list, KEYS[2] "uniquejobs:digests".
-- ARGV: triples of payload as fetched, "<digest>:LOCKED", jid.
-- Returns how many of the jobs were still in the working list.
local working, digests = KEYS[1], KEYS[2]
local removed = 0
for i = 1, #ARGV, 3 do
  -- From the tail, where the oldest (first finished) jobs are.
  if redis.call('LREM', working, -1, ARGV[i]) == 1 then
    removed = removed + 1
    release_hold(ARGV[i + 1], digests, ARGV[i + 2])
  end
end
return removed
