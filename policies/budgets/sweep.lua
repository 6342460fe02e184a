-- Reclaim every expired reservation of one team. KEYS: 1 reserved, 2 res, 3 lease.
-- Returns the number reclaimed.
local total = 0
while true do
  local n = reclaim(KEYS[1], KEYS[2], KEYS[3], now_ms(), 256)
  total = total + n
  if n < 256 then return total end
end
