-- uses: fits
-- Put an unfinished job back where it is fetched next (the right end of its
-- queue) and out of the working list, only if it is still there, so two
-- requeues of the same job cannot double it. A queue key of another type
-- would refuse the push after the LREM, so it is checked first.
-- KEYS[1] working list, KEYS[2] queue list. ARGV[1] payload.
-- Returns 1 moved, 0 not in the working list, -1 the queue key is not a list.
if not fits(KEYS[2], 'list') then
  return -1
end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) > 0 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
