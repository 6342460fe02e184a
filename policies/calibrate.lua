-- One step of a policy's shared calibration state (policies/calibration.py `advance`, the same
-- arithmetic): start or restart it, decay, add a replica's new scores, move the threshold.
-- KEYS: 1 the policy's HASH (counts, threshold, seen, updates, tag, cusum_up, cusum_down,
--   resets).
-- ARGV: 1 new counts as "bin,count,bin,count,..." (0-based bins; '' for none), 2 m (scores in
--   them), 3 start threshold, 4 target share, 5 window_requests, 6 warmup_requests,
--   7 min_threshold, 8 max_threshold, 9 max_step, 10 bins, 11 tag, 12 ttl s, 13 count floor,
--   14 shift_delta, 15 shift_limit.
-- Returns {threshold as text, seen, updates} (text: Redis turns a Lua number into an integer).
local key = KEYS[1]
local m = tonumber(ARGV[2])
local start, target = tonumber(ARGV[3]), tonumber(ARGV[4])
local window, warmup = tonumber(ARGV[5]), tonumber(ARGV[6])
local lo, hi, step = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local bins, tag, ttl, floor = tonumber(ARGV[10]), ARGV[11], tonumber(ARGV[12]), tonumber(ARGV[13])
local delta, limit = tonumber(ARGV[14]), tonumber(ARGV[15])

local function clamp(v, a, b)
  if v < a then return a end
  if v > b then return b end
  return v
end

-- The counts are stored as `bins` little-endian doubles: unpacked and packed in C (struct),
-- exact, where text would be parsed and formatted number by number on every push.
local layout = '<' .. string.rep('d', bins)
local stored = redis.call('HMGET', key, 'counts', 'threshold', 'seen', 'updates', 'tag',
  'cusum_up', 'cusum_down', 'resets')
local counts, threshold, seen, updates, up, down, resets = {}, nil, 0, 0, 0, 0, 0
if stored[1] and stored[5] == tag and #stored[1] == 8 * bins then
  counts = {struct.unpack(layout, stored[1])}
  counts[#counts] = nil  -- unpack's last value is the position after the data
  threshold, seen, updates = tonumber(stored[2]), tonumber(stored[3]), tonumber(stored[4])
  up, down, resets = tonumber(stored[6]), tonumber(stored[7]), tonumber(stored[8])
end
if #counts ~= bins then
  counts = {}
  for i = 1, bins do counts[i] = 0 end
  threshold, seen, updates, up, down, resets = clamp(start, lo, hi), 0, 0, 0, 0, 0
end
if m <= 0 then
  return {string.format('%.17g', threshold), seen, updates}
end

local keep = (1 - 1 / window) ^ m
for i = 1, bins do counts[i] = counts[i] * keep end
local pending = {}
for v in string.gmatch(ARGV[1], '[^,]+') do pending[#pending + 1] = tonumber(v) end

-- The change detector: a batched Bernoulli CUSUM on "sent large at the threshold in force".
local function llr(k, n, p0, p1)
  return k * math.log(p1 / p0) + (n - k) * math.log((1 - p1) / (1 - p0))
end
if seen >= warmup and delta > 0 and target > 0 and target < 1 then
  local from = math.ceil(threshold * bins - 1e-9)
  local k = 0
  for j = 1, #pending, 2 do
    if pending[j] >= from then k = k + pending[j + 1] end
  end
  up = math.max(0, up + llr(k, m, target, math.min(target + delta, 1 - 1e-6)))
  down = math.max(0, down + llr(k, m, target, math.max(target - delta, 1e-6)))
  if up >= limit or down >= limit then
    for i = 1, bins do counts[i] = 0 end
    up, down, resets = 0, 0, resets + 1
  end
end
for j = 1, #pending, 2 do
  counts[pending[j] + 1] = counts[pending[j] + 1] + pending[j + 1]
end
for i = 1, bins do
  if counts[i] < floor then counts[i] = 0 end
end
seen = seen + m

if seen >= warmup then
  -- classifiers/score_reference.py quantile_from_counts: the highest bin whose mass at or above
  -- its lower edge reaches target * total, then linear inside that bin.
  local total = 0
  for i = 1, bins do total = total + counts[i] end
  local want = target * total
  local q = 1.0
  if want > 0 then
    local above = 0
    for i = bins, 1, -1 do
      local over = above
      above = above + counts[i]
      if above >= want then
        local frac = 0
        if counts[i] > 0 then frac = (want - over) / counts[i] end
        q = (i - frac) / bins
        break
      end
    end
  end
  threshold = clamp(clamp(q, threshold - step, threshold + step), lo, hi)
  updates = updates + 1
end

redis.call('HSET', key, 'counts', struct.pack(layout, unpack(counts)), 'threshold',
  string.format('%.17g', threshold), 'seen', seen, 'updates', updates, 'tag', tag,
  'cusum_up', string.format('%.17g', up), 'cusum_down', string.format('%.17g', down),
  'resets', resets)
redis.call('EXPIRE', key, ttl)
return {string.format('%.17g', threshold), seen, updates}
