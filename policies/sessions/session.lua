-- A session's step on its own (session_fn.lua). KEYS: 1 the session's HASH. ARGV: the step's.
local step = session_step(KEYS[1], 1, true)
return step
