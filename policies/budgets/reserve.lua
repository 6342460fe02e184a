-- The budget check-and-reserve of one request (reserve_fn.lua) at the amount it states.
return reserve(ARGV[2], ARGV[3])
