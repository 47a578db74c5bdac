-- batch_done(bid, jid, outcome, payload): what the ack of one job of batch
-- bid does to the batch, in the ack's own step. outcome is "s" (succeeded),
-- "f" (failed: a retry is due, or it was dropped) or "d" (dead); payload is
-- the failed job as stored, whose error_class and error_message are kept.
-- Each jid's state is kept in batch:BID:jids, so a job acked twice (run
-- again after a crash, or retried) never counts twice: the counters move
-- only when the state moves forward. When the batch is committed and a
-- condition holds for the first time its callback is pushed (once: its
-- *_at field marks it), and a child batch reports to its parent the same
-- way, as one member "b:CHILD". Returns 2 when bid names no batch (the job
-- then ran as a plain job), else what the step fired, counted for the
-- metrics: 4 a complete, 4096 a success, 4194304 a death (the counts in
-- 10-bit fields from bit 2, 12 and 22), of bid and of the parents it
-- reached.
-- Keys (documented in the README): batch:BID (hash: counters, options,
-- callbacks), batch:BID:jids (jid -> s|f|d), batch:BID:failures (jid ->
-- "Class: message"), batches (zset of bids by creation time), batches:open
-- (the same, until success).
local function batch_num(key, field)
  return tonumber(redis.call('HGET', key, field) or '0') or 0
end

-- A key created by this step lives as long as its batch. (batch:BID:jids
-- is made with the batch, its placeholder field "" keeping it, and its
-- expiry, from the start.)
local function batch_keep(key, like)
  if redis.call('PTTL', key) == -1 then
    local ttl = redis.call('PTTL', like)
    if ttl > 0 then
      redis.call('PEXPIRE', key, ttl)
    end
  end
end

local function batch_now()
  local t = redis.call('TIME')
  return t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
end

-- Pushes the callback of event, if one was given: a plain Sidekiq job
-- whose args are [status, options]; its jid is derived from the bid and
-- event, so even a second push would be the same job. "batch_event" lets a
-- capstan that runs it measure the callback's latency. A child batch's callback
-- is a job of its parent, counted there before the child's member moves, so
-- the parent's callbacks wait for it to have run (complete) and succeeded
-- (success), as Sidekiq Pro's do: the callback may add jobs to the parent.
-- pkey is the parent's key when there is one and it exists, else nil.
local function batch_callback(key, bid, event, now, pkey)
  local cb = redis.call('HMGET', key, 'cb_' .. event .. '_class', 'cb_' .. event .. '_queue',
    'cb_' .. event .. '_opts', 'description', 'total', 'pending', 'created_at', 'parent')
  if not cb[1] then
    return
  end
  local status = cjson.encode({ bid = bid, event = event, description = cb[4] or '',
    total = tonumber(cb[5]) or 0, pending = tonumber(cb[6]) or 0,
    failures = redis.call('HLEN', key .. ':failures'),
    created_at = tonumber(cb[7]) or 0, parent_bid = cb[8] or '' })
  local jid = string.sub(redis.sha1hex(bid .. ':' .. event), 1, 24)
  local in_parent = ''
  if pkey then
    for _, field in ipairs({ 'total', 'pending', 'notrun' }) do
      redis.call('HINCRBY', pkey, field, 1)
    end
    in_parent = ',"bid":' .. cjson.encode(cb[8])
  end
  local job = '{"retry":true,"queue":' .. cjson.encode(cb[2]) .. ',"args":[' .. status .. ','
    .. cb[3] .. '],"class":' .. cjson.encode(cb[1]) .. ',"jid":"' .. jid
    .. '","created_at":' .. now .. ',"enqueued_at":' .. now .. ',"batch_event":"' .. event
    .. '"' .. in_parent .. '}'
  redis.call('SADD', 'queues', cb[2])
  redis.call('LPUSH', 'queue:' .. cb[2], job)
end

-- Moves member of batch key from was (its state, nil for none) to
-- outcome. Returns whether it moved (not when that is no move forward),
-- and whether a callback may be due now.
local function batch_mark(key, member, was, outcome, err)
  if was == 's' or was == outcome or (was == 'd' and outcome == 'f') then
    return false
  end
  redis.call('HSET', key .. ':jids', member, outcome)
  -- The counters say when a condition may have become true, so the check
  -- (batch_check) runs only then: at the last first run, the last success
  -- or a death. Neither goes below 0, even for a job pushed with the bid by
  -- hand.
  local due = outcome == 'd'
  if not was then
    local left = redis.call('HINCRBY', key, 'notrun', -1)
    due = due or left <= 0
    if left < 0 then
      redis.call('HSET', key, 'notrun', 0)
    end
  end
  if outcome == 's' then
    if was == 'd' then
      redis.call('HINCRBY', key, 'dead', -1)
    end
    if was then
      redis.call('HDEL', key .. ':failures', member)
    end
    local left = redis.call('HINCRBY', key, 'pending', -1)
    if left < 0 then
      redis.call('HSET', key, 'pending', 0)
    end
    return true, due or left <= 0
  end
  if outcome == 'd' then
    redis.call('HINCRBY', key, 'dead', 1)
  end
  redis.call('HSET', key .. ':failures', member, err)
  batch_keep(key .. ':failures', key)
  return true, due
end

-- Fires what is due on batch bid once it is committed, then walks up to
-- its parent, which sees a child as one member. Returns what it fired, on
-- bid and its parents, counted as batch_done says.
local function batch_check(bid)
  local fired, now = 0, nil
  while bid do
    local key = 'batch:' .. bid
    local f = redis.call('HMGET', key, 'open', 'notrun', 'pending', 'dead',
      'complete_at', 'success_at', 'death_at', 'parent', 'created_at')
    if not f[9] or (tonumber(f[1]) or 0) > 0 then
      break
    end
    local ran_all = (tonumber(f[2]) or 0) <= 0
    local events = {}
    if not f[7] and (tonumber(f[4]) or 0) > 0 then
      events[#events + 1] = { 'death', 'death_at', 4194304, 'd' }
    end
    if not f[5] and ran_all then
      events[#events + 1] = { 'complete', 'complete_at', 4, 'f' }
    end
    if not f[6] and ran_all and (tonumber(f[3]) or 0) <= 0 then
      events[#events + 1] = { 'success', 'success_at', 4096, 's' }
    end
    if #events == 0 then
      break
    end
    now = now or batch_now()
    local moved, pkey = false, f[8] and 'batch:' .. f[8]
    if pkey and redis.call('EXISTS', pkey) == 0 then
      pkey = nil
    end
    for _, e in ipairs(events) do
      redis.call('HSET', key, e[2], now)
      batch_callback(key, bid, e[1], now, pkey)
      fired = fired + e[3]
      if pkey then
        local was = redis.call('HGET', pkey .. ':jids', 'b:' .. bid)
        local _, due = batch_mark(pkey, 'b:' .. bid, was, e[4],
          'child batch ' .. bid .. ' has failures')
        moved = due or moved
      end
    end
    if f[6] or events[#events][1] == 'success' then
      redis.call('ZREM', 'batches:open', bid)
      -- Done: the batch lingers for its status to be read, then goes.
      local linger = batch_num(key, 'linger')
      for _, k in ipairs({ key, key .. ':jids', key .. ':failures' }) do
        redis.call('EXPIRE', k, linger > 0 and linger or 1)
      end
    end
    bid = moved and f[8] or nil
  end
  return fired
end

local function batch_done(bid, jid, outcome, payload)
  local key = 'batch:' .. bid
  local was = redis.call('HGET', key .. ':jids', jid)
  if redis.call('EXISTS', key) == 0 then
    return 2
  end
  local err = ''
  if outcome ~= 's' and payload ~= '' then
    local ok, job = pcall(cjson.decode, payload)
    if ok and type(job) == 'table' then
      err = tostring(job.error_class or 'Error') .. ': ' .. tostring(job.error_message or '')
    end
  end
  local _, due = batch_mark(key, jid, was, outcome, err)
  return due and batch_check(bid) or 0
end

-- For a script that acks several jobs at once (acks.lua): batch_ok(acc,
-- bid, jid) records the success of job jid of batch bid, its state at once
-- and its counter moves in acc (a table the script keeps), which
-- batch_flush(acc) writes once per batch before checking it. Same rules as
-- batch_done. batch_ok returns 2 when bid names no batch, else 0;
-- batch_flush returns what the batches fired, counted as batch_done says.
local function batch_ok(acc, bid, jid)
  -- A batch's key names are made once per call; a bid naming no batch is
  -- remembered as false.
  local b = acc[bid]
  if b == nil then
    local key = 'batch:' .. bid
    b = redis.call('EXISTS', key) == 1
      and { key = key, jids = key .. ':jids', notrun = 0, pending = 0 }
    acc[bid] = b
  end
  if not b then
    return 2
  end
  -- Most jobs succeed at their first run: one HSETNX then.
  if redis.call('HSETNX', b.jids, jid, 's') == 1 then
    b.notrun = b.notrun + 1
  else
    local was = redis.call('HGET', b.jids, jid)
    if was == 's' then
      return 0
    end
    redis.call('HSET', b.jids, jid, 's')
    redis.call('HDEL', b.key .. ':failures', jid)
    if was == 'd' then
      redis.call('HINCRBY', b.key, 'dead', -1)
    end
  end
  b.pending = b.pending + 1
  return 0
end

local function batch_flush(acc)
  local fired = 0
  for bid, b in pairs(acc) do
    local due = false
    for _, field in ipairs(b and { 'notrun', 'pending' } or {}) do
      if b[field] > 0 then
        local left = redis.call('HINCRBY', b.key, field, -b[field])
        if left < 0 then
          redis.call('HSET', b.key, field, 0)
        end
        due = due or left <= 0
      end
    end
    if due then
      fired = fired + batch_check(bid)
    end
  end
  return fired
end
