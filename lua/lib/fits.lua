-- fits(key, kind): whether key is absent or of type kind ("list", "zset"),
-- and its type. A script checks this before it removes anything: a write
-- refused afterwards would not roll the removal back.
local function fits(key, kind)
  local t = redis.call('TYPE', key).ok
  return t == kind or t == 'none', t
end
