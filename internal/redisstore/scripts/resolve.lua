-- resolve: settle an unknown record after an operator checked the domain.
-- Mirrors idem.ApplyResolve.
--
-- KEYS[1]  record key
-- ARGV[1]  "release" or "complete"
-- ARGV[2]  retention, milliseconds (complete)
-- ARGV[3]  response head, as for complete.lua (complete)
-- ARGV[4]  response body (complete)
--
-- Returns 1 when resolved, 0 when no record exists, -1 when the record is
-- not unknown.

if redis.call('TYPE', KEYS[1])['ok'] == 'string' then
  return -1 -- completed
end
local cur = redis.call('HMGET', KEYS[1], 's', 't', 'a', 'c', 'f')
local s = cur[1]
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
-- The completed record's string, as complete.lua writes it.
redis.call('SET', KEYS[1], completed_record(cur[5], cur[2], cur[3], cur[4], ARGV[3], ARGV[4]), 'PX', ARGV[2])
return 1
