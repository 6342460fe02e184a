-- Extend the leases of reservations whose replica is alive and still working on them, so a
-- stream may outlive lease_s while a dead replica's holds still expire after lease_s.
-- KEYS: 1 lease ZSET. ARGV: 1 lease ms, then request ids. Returns how many were extended.
local expires = now_ms() + tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', expires, ARGV[i])
end
return n
