-- uses: fits
-- uses: batch_done
-- Give back the jobs of a process that died: only when its liveness key is
-- gone, and each job only if it is still in the dead process's working list.
-- KEYS[1] working list, KEYS[2] liveness key, KEYS[3] dead zset,
-- KEYS[4] suspect marker, then, declared for the groups below (which name
-- them again): each destination queue, and each poison pill's batch
-- ("batch:BID", "batch:BID:jids", "batch:BID:failures", then
-- "batches:open" and "queues"; a parent's keys and the callbacks' queues,
-- read from a batch, cannot be declared: doc/internals.md).
-- ARGV[1] grace in ms, ARGV[2] marker TTL in ms, then groups of 4: payload
-- as listed, payload to write, destination ("queue:NAME" list or "dead"),
-- score (dead only).
--
-- A missing liveness key alone does not prove the owner dead: its refresh
-- may have been refused (maxmemory) or lost (a restart). The first pass that
-- sees it missing only writes the marker with Redis's clock; jobs move at a
-- later pass, once the key is still missing grace ms after that. A live
-- owner re-creates its key well within the grace and deletes the marker.
-- When the marker cannot be written (maxmemory), the script fails before
-- anything moved. Grace 0 skips the marker.
--
-- A destination of another type would refuse the write after the LREM (a
-- script is not rolled back), so such a job is left in the working list.
-- Returns {recovered, killed, left, what the batches of the poison pills
-- fired (counted as lib/batch_done.lua says)}, -1 when the owner is alive,
-- or -2 when it is only a suspect so far.
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('DEL', KEYS[4])
  return -1
end
local grace = tonumber(ARGV[1])
if grace > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local first = tonumber(redis.call('GET', KEYS[4]) or '')
  if not first then
    redis.call('SET', KEYS[4], string.format('%d', now), 'PX', ARGV[2])
    return -2
  end
  if now - first < grace then
    return -2
  end
end
local recovered, killed, left, fired = 0, 0, 0, 0
for i = 3, #ARGV, 4 do
  local dest = ARGV[i + 2]
  if not fits(dest, dest == 'dead' and 'zset' or 'list') then
    left = left + 1
  elseif redis.call('LREM', KEYS[1], 1, ARGV[i]) > 0 then
    if dest == 'dead' then
      redis.call('ZADD', KEYS[3], ARGV[i + 3], ARGV[i + 1])
      killed = killed + 1
      -- A poison pill of a batch is one of its dead jobs.
      local ok, job = pcall(cjson.decode, ARGV[i + 1])
      if ok and type(job) == 'table' and type(job.bid) == 'string' and type(job.jid) == 'string' then
        local f = batch_done(job.bid, job.jid, 'd', ARGV[i + 1])
        if f ~= 2 then -- 2: no such batch
          fired = fired + f
        end
      end
    else
      redis.call('RPUSH', dest, ARGV[i + 1])
      recovered = recovered + 1
    end
  end
end
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[4])
end
return {recovered, killed, left, fired}
