-- Zero a scope's spend in the current window of every period; the ledger records it.
-- KEYS: 1 spend HASH, 2 ledger STREAM. ARGV: 1 scope, 2 team, 3 key id or '', 4.. period ids.
-- Returns the nanos wiped.
local wiped = 0
local listed = {}
for i = 4, #ARGV do
  local field = ARGV[1] .. '|' .. ARGV[i]
  wiped = wiped + tonumber(redis.call('HGET', KEYS[1], field) or '0')
  redis.call('HDEL', KEYS[1], field)
  listed[#listed + 1] = ARGV[1] .. '=' .. ARGV[i]
end
local text = string.format('%d', wiped)
redis.call('XADD', KEYS[2], '*', 'rid', '', 'team', ARGV[2], 'key', ARGV[3],
  'nanos', '-' .. text, 'tokens', '0', 'kind', 'reset', 'periods', table.concat(listed, ';'))
return text
