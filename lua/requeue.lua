-- uses: fits
-- Put unfinished jobs back where they are fetched next (the right end of
-- their queue) and out of the working list, each only if it is still
-- there, so two requeues of the same job cannot double it. A queue key of
-- another type would refuse the push after the LREM, so it is checked
-- first.
-- KEYS[1] working list, KEYS[2] queue list. ARGV the payloads, newest
-- first: the last one given ends at the head of the queue.
-- Returns how many moved (the others were no longer in the working list),
-- or -1 when the queue key is not a list.
if not fits(KEYS[2], 'list') then
  return -1
end
local moved = 0
for i = 1, #ARGV do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) > 0 then
    redis.call('RPUSH', KEYS[2], ARGV[i])
    moved = moved + 1
  end
end
return moved
