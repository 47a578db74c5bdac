-- The replace strategy: remove the job that holds a digest from its queue,
-- "schedule" or "retry", then delete the lock, so the new push can take it.
-- Matching is by plain substring (v9 uses a Lua pattern, which misreads
-- prefixes holding '-' or '.'), and each structure is scanned for at most
-- ARGV[2] entries, in pages, so a huge queue cannot stall Redis.
-- KEYS[1] queue list, KEYS[2] schedule, KEYS[3] retry, KEYS[4] the locked
-- hash, KEYS[5] the digests zset. ARGV[1] digest, ARGV[2] scan limit.
-- Returns the removed payload, or nil when no job holds the digest.
local digest, limit, page = ARGV[1], tonumber(ARGV[2]), 50
local function forget()
  redis.call('UNLINK', KEYS[4])
  redis.call('ZREM', KEYS[5], digest)
end
local n = math.min(redis.call('LLEN', KEYS[1]), limit)
for start = 0, n - 1, page do
  local items = redis.call('LRANGE', KEYS[1], start, start + page - 1)
  for _, job in ipairs(items) do
    if string.find(job, digest, 1, true) then
      redis.call('LREM', KEYS[1], 1, job)
      forget()
      return job
    end
  end
end
for k = 2, 3 do
  n = math.min(redis.call('ZCARD', KEYS[k]), limit)
  for start = 0, n - 1, page do
    local items = redis.call('ZRANGE', KEYS[k], start, start + page - 1)
    for _, job in ipairs(items) do
      if string.find(job, digest, 1, true) then
        redis.call('ZREM', KEYS[k], job)
        forget()
        return job
      end
    end
  end
end
return nil
