-- cancel: undo the reservation of an attempt that gave up on it without
-- knowing whether it reached Redis, and never let its request through.
-- Mirrors idem.ApplyCancel, and marks the token cancelled so that the
-- reservation, should it arrive later, changes nothing (reserve.lua checks
-- the marker first). Whichever comes first, no reservation by the token
-- remains.
--
-- KEYS[1]  record key
-- KEYS[2]  the token's cancel marker (CancelledKey)
-- ARGV[1]  attempt token
-- ARGV[2]  how long the marker stands, milliseconds
--
-- Returns 1 when the token's record was deleted, 0 when the token held
-- none (no record, another token's, or a completed one: left alone).
-- Publishes on the channel KEYS[1] when a duplicate waits (see watch.lua).
--
-- The record is deleted before the marker is written: under maxmemory
-- with noeviction, Redis checks memory only before a script's first change
-- (script.c, scriptVerifyOOM), and DEL is not refused, so a record that
-- landed is still undone and the marker written after it. When the token
-- held no record, the marker is the script's first change and is refused
-- (the call fails and is retried); a reservation arriving meanwhile is
-- refused by the same check.

local deleted = 0
if redis.call('TYPE', KEYS[1])['ok'] == 'hash' then
  local cur = redis.call('HMGET', KEYS[1], 't', 'w')
  if cur[1] == ARGV[1] then
    redis.call('DEL', KEYS[1])
    if cur[2] then
      redis.call('PUBLISH', KEYS[1], 'r')
    end
    deleted = 1
  end
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return deleted
