-- purge: delete a record whatever its state, by an operator's word.
--
-- KEYS[1]  record key
--
-- Returns 1 when deleted, 0 when no record exists. Wakes waiters (see
-- watch.lua).

local w = false
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  w = redis.call('HGET', KEYS[1], 'w')
end
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
if w then
  redis.call('PUBLISH', KEYS[1], 'p')
end
return 1
