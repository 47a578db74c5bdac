-- Whether the caller still holds the queued lock at key: its acq_id, and
-- its fencing token unless fence is "". After its ttl ran out the key may
-- belong to the next holder.
local function holds_qlock(key, acq_id, fence)
  return redis.call('HGET', key, 'acq_id') == acq_id
    and (fence == '' or redis.call('HGET', key, 'capstan_fence') == fence)
end
