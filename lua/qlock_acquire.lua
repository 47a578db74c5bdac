-- One attempt at a queued (FIFO) lock, in redis_queued_locks' key layout.
-- Joining the queue, dropping dead places, and taking the lock happen in one
-- step, so two waiters can never both see themselves first and the lock free.
-- Times come from the server (TIME), so clients' clock skew cannot reorder
-- the queue.
--
-- A place in the queue belongs to a live waiter: each attempt pushes the
-- waiter's deadline (now + its own queue_ttl) into a side hash, and a head
-- whose deadline has passed is dropped. So a dead waiter stops blocking after
-- its own queue_ttl, and one caller's short queue_ttl never evicts others.
-- Places written by the Ruby gem have no deadline; they last queue_ttl from
-- their request time, as the gem's own purge would have it.
--
-- KEYS[1] rql:lock:NAME (hash)  KEYS[2] rql:lock_queue:NAME (zset)
-- KEYS[3] side hash acq_id -> deadline ms   KEYS[4] fencing counter
-- ARGV[1] acq_id  ARGV[2] hst_id  ARGV[3] ttl ms  ARGV[4] queue_ttl ms
-- ARGV[5] "1" when this waiter believes it already has a place
-- ARGV[6] "1" for fail_fast  ARGV[7..] metadata field, value pairs
--
-- Returns {"ok", fence, ts, request_score}
--      or {"fail_fast_no_try", holder}
--      or {"held" | "not_first" | "requeued", holder or head, rank, request_score}
local lock, queue, seen, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, host = ARGV[1], ARGV[2]
local ttl, qttl = tonumber(ARGV[3]), tonumber(ARGV[4])

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))

local held = redis.call('EXISTS', lock) == 1
local holder = redis.call('HGET', lock, 'acq_id') or ''
if ARGV[6] == '1' and held then
  return {'fail_fast_no_try', holder}
end

local status = nil
local score = redis.call('ZSCORE', queue, me)
if not score then
  -- A waiter whose place was dropped rejoins at the back, as the gem resets
  -- its position once its queue_ttl has passed.
  if ARGV[5] == '1' then status = 'requeued' end
  score = now
  redis.call('ZADD', queue, score, me)
end
redis.call('HSET', seen, me, now_ms + qttl)
if redis.call('PTTL', seen) < qttl then
  redis.call('PEXPIRE', seen, qttl * 2)
end

local head = nil
for _ = 1, 100 do
  local h = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
  head = h[1]
  if not head or head == me then break end
  local deadline = tonumber(redis.call('HGET', seen, head))
  if not deadline then
    deadline = tonumber(h[2]) * 1000 + qttl
  end
  if deadline >= now_ms then break end
  redis.call('ZREM', queue, head)
  redis.call('HDEL', seen, head)
  head = nil
end

if held or head ~= me then
  local rank = redis.call('ZRANK', queue, me) or -1
  if not status then status = held and 'held' or 'not_first' end
  return {status, held and holder or (head or ''), rank, score}
end

redis.call('ZREM', queue, me)
redis.call('HDEL', seen, me)
if redis.call('ZCARD', queue) == 0 then
  redis.call('DEL', seen)
end
local token = redis.call('INCR', fence)
local fields = {'acq_id', me, 'hst_id', host, 'ts', now, 'ini_ttl', ttl, 'capstan_fence', token}
for i = 7, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', lock, unpack(fields))
redis.call('PEXPIRE', lock, ttl)
return {'ok', token, now, score}
