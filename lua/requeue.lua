-- Put an unfinished job back where it is fetched next (the right end of its
-- queue) and out of the working list, only if it is still there, so two
-- requeues of the same job cannot double it.
-- KEYS[1] working list, KEYS[2] queue list. ARGV[1] payload.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) > 0 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  return 1
end
return 0
