-- zset_put(z, digests, locked, score): indexes the digest of the lock hash
-- locked ("<digest>:LOCKED") in the digests zset with score, or takes it
-- out when score is false. At once when z is nil; else kept in the table z
-- (the last change to a digest wins) until zset_flush(z, digests) writes
-- them all with one ZREM and one ZADD: a script that locks or releases many
-- jobs pays the per-command cost once, not per job.
local function zset_put(z, digests, locked, score)
  local digest = locked
  if string.sub(locked, -7) == ':LOCKED' then
    digest = string.sub(locked, 1, -8)
  end
  if z then
    z[digest] = score
  elseif score then
    redis.call('ZADD', digests, score, digest)
  else
    redis.call('ZREM', digests, digest)
  end
end

local function zset_flush(z, digests)
  local add, rem = {}, {}
  for digest, score in pairs(z) do
    if score then
      add[#add + 1] = score
      add[#add + 1] = digest
    else
      rem[#rem + 1] = digest
    end
  end
  -- unpack() is bounded by Lua's stack: a few hundred arguments a command.
  for i = 1, #rem, 400 do
    redis.call('ZREM', digests, unpack(rem, i, math.min(i + 399, #rem)))
  end
  for i = 1, #add, 800 do
    redis.call('ZADD', digests, unpack(add, i, math.min(i + 799, #add)))
  end
end
