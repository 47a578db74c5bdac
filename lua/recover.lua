-- Give back the jobs of a process that died: only when its liveness key is
-- gone, and each job only if it is still in the dead process's working list.
-- KEYS[1] working list, KEYS[2] liveness key, KEYS[3] dead zset.
-- ARGV: groups of 4: payload as listed, payload to write, destination
-- ("queue:NAME" list or "dead"), score (dead only).
-- Returns {recovered, killed} or -1 when the owner is alive.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return -1
end
local recovered, killed = 0, 0
for i = 1, #ARGV, 4 do
  if redis.call('LREM', KEYS[1], 1, ARGV[i]) > 0 then
    if ARGV[i + 2] == 'dead' then
      redis.call('ZADD', KEYS[3], ARGV[i + 3], ARGV[i + 1])
      killed = killed + 1
    else
      redis.call('RPUSH', ARGV[i + 2], ARGV[i + 1])
      recovered = recovered + 1
    end
  end
end
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
end
return {recovered, killed}
