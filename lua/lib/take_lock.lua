-- uses: zset_batch
-- take_lock(locked, digests, jid, pttl, type, limit, meta, now, z): takes
-- jid's hold on the uniqueness lock hash locked ("<digest>:LOCKED", jid ->
-- metadata JSON) and indexes the digest in the digests zset, in v9's
-- format (z as in zset_batch). pttl in ms (0 = none), now in
-- float seconds. Returns 2 when jid held it already (not refreshed, as
-- v9), 1 when taken, 0 when the limit of holders is reached.
local function take_lock(locked, digests, jid, pttl, type, limit, meta, now, z)
  local holders = redis.call('HLEN', locked)
  if holders > 0 and redis.call('HEXISTS', locked, jid) == 1 then
    return 2
  end
  limit = tonumber(limit) or 1
  -- v9 reads a null limit as 0 and then refuses everyone: take 1 instead.
  if limit < 1 then limit = 1 end
  if holders >= limit then
    return 0
  end
  redis.call('HSET', locked, jid, meta)
  pttl = tonumber(pttl) or 0
  local score = now
  -- v9 adds milliseconds to seconds here, pushing until_expired entries years
  -- ahead of the reaper; the expiry time in seconds is what it meant.
  if type == 'until_expired' and pttl > 0 then
    score = tonumber(now) + pttl / 1000
  end
  zset_put(z, digests, locked, score)
  if pttl > 0 then
    redis.call('PEXPIRE', locked, pttl)
  end
  return 1
end
