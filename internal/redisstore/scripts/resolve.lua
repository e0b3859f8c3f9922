-- resolve: settle an unknown record after an operator checked the domain.
-- Mirrors idem.ApplyResolve.
--
-- KEYS[1]  record key
-- ARGV[1]  "release" or "complete"
-- ARGV[2]  retention, milliseconds (complete)
-- ARGV[3]  response status (complete)
-- ARGV[4]  encoded response headers (complete)
-- ARGV[5]  response body (complete)
-- ARGV[6]  response flags, as for complete.lua (complete)
--
-- Returns 1 when resolved, 0 when no record exists, -1 when the record is
-- not unknown.

local s = redis.call('HGET', KEYS[1], 's')
if not s then
  return 0
end
if s ~= 'u' then
  return -1
end
if ARGV[1] == 'release' then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HSET', KEYS[1], 's', 'c', 'st', ARGV[3], 'h', ARGV[4], 'b', ARGV[5], 'o', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
