-- The reaper's last word on a batch of digests it found orphaned: checks
-- again, atomically, what could have changed since it looked, and removes
-- only what is still orphaned.
--
-- A digest is removed when its <digest>:LOCKED hash is empty, or when its
-- holders are exactly the jids the reaper saw and none of them is in a
-- working list, a live process's <identity>:work hash, or the fetched end
-- of a queue (where a requeue or recovery puts a job back). The reaper's
-- own sweep of schedule, retry and whole queues came first; these are the
-- places a job can move into while that sweep ran.
--
-- KEYS[1] uniquejobs:digests, KEYS[2] processes, KEYS[3] queues; KEYS[4..]
-- the working lists the reaper found and the <digest>:LOCKED hashes of the
-- digests below (declared: every key known ahead is; the keys of the live
-- processes and queues read here cannot be, doc/internals.md).
-- ARGV[1] how many jobs at the fetched end of each queue to look at;
-- then per digest: digest, n, and its n holder jids as seen (n = 0: the
-- hash was empty).
-- Returns the digests removed.
local tail = tonumber(ARGV[1])
local live = nil

local function add_jids(set, text)
  -- Plain or JSON-in-JSON (a work hash holds the payload as a string).
  for jid in string.gmatch(text, 'jid\\?"%s*:%s*\\?"([^"\\]+)') do
    set[jid] = true
  end
end

local function live_jids()
  local set, seen = {}, {}
  local function scan_list(key, start)
    if seen[key] then return end
    seen[key] = true
    if redis.call('TYPE', key).ok ~= 'list' then return end
    for _, job in ipairs(redis.call('LRANGE', key, start, -1)) do
      add_jids(set, job)
    end
  end
  -- The lock hashes among them are not lists: scan_list passes them by.
  for i = 4, #KEYS do
    scan_list(KEYS[i], 0)
  end
  for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    scan_list('uniquejobs:working:' .. id, 0)
    if redis.call('EXISTS', id) == 1 then
      for _, work in ipairs(redis.call('HVALS', id .. ':work')) do
        add_jids(set, work)
      end
    end
  end
  for _, q in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    scan_list('queue:' .. q, -tail)
  end
  return set
end

local removed = {}
local i = 2
while i <= #ARGV do
  local digest = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  local expected = {}
  for k = 1, n do
    expected[ARGV[i + 1 + k]] = true
  end
  i = i + 2 + n

  local locked = digest .. ':LOCKED'
  local holders = redis.call('HKEYS', locked)
  local orphan = true
  if #holders > 0 then
    for _, jid in ipairs(holders) do
      if not expected[jid] then
        orphan = false -- locked again since the reaper looked
        break
      end
    end
    if orphan then
      live = live or live_jids()
      for _, jid in ipairs(holders) do
        if live[jid] then
          orphan = false
          break
        end
      end
    end
  end
  if orphan then
    local gone = 0
    if #holders > 0 then
      gone = redis.call('UNLINK', locked)
    end
    if redis.call('ZREM', KEYS[1], digest) + gone > 0 then
      removed[#removed + 1] = digest
    end
  end
end
return removed
