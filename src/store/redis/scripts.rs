//! The Lua scripts of the Redis backend: each is one atomic step on a
//! stream's keys (and the global indexes it must keep in step), so that no
//! reader ever sees half a write. Scripts only move cursors and times
//! forward, and write back the caller's own strings for numbers they compare
//! (Lua numbers are doubles, exact below 2^53).

use redis::Script;

pub(super) struct Scripts {
    pub create: Script,
    pub append: Script,
    pub change: Script,
    pub delete: Script,
}

/// Creates (or replaces) a stream's metadata and indexes it.
/// KEYS: meta, session streams, all streams, abandon, finished, requests.
/// ARGV: stream id, created_ms, abandon_at ('' none), finished_ms ('' none),
/// number of field/value pairs, the pairs, then the request ids.
const CREATE: &str = r#"
redis.call('DEL', KEYS[1])
local n = tonumber(ARGV[5])
local i = 6
for _ = 1, n do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1]) end
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1]) end
local created = tonumber(ARGV[2])
while i <= #ARGV do
  local old = redis.call('HGET', KEYS[6], ARGV[i])
  local newer = false
  if old then
    local space = string.find(old, ' ', 1, true)
    newer = space and tonumber(string.sub(old, 1, space - 1)) > created
  end
  if not newer then redis.call('HSET', KEYS[6], ARGV[i], ARGV[2] .. ' ' .. ARGV[1]) end
  i = i + 1
end
return 0
"#;

/// Appends messages, counts them, and records the upstream mark and a
/// status change, all or nothing. Returns the last seq, -1 for no stream.
/// KEYS: meta, log, finished.
/// ARGV: stream id, has mark ('1'/'0'), mark event id, status ('' none),
/// finished_ms ('' when live), outcome ('' none), then the messages.
const APPEND: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local seq = tonumber(redis.call('HGET', KEYS[1], 'entries') or '0')
local added = 0
for i = 7, #ARGV do
  seq = seq + 1
  redis.call('XADD', KEYS[2], '0-' .. string.format('%d', seq), 'm', ARGV[i])
  added = added + string.len(ARGV[i])
end
local fields = {'entries', string.format('%d', seq)}
if added > 0 then redis.call('HINCRBY', KEYS[1], 'bytes', added) end
if ARGV[2] == '1' then
  table.insert(fields, 'up_event'); table.insert(fields, ARGV[3])
  table.insert(fields, 'up_seq'); table.insert(fields, string.format('%d', seq))
end
if ARGV[4] ~= '' then
  table.insert(fields, 'status'); table.insert(fields, ARGV[4])
  if ARGV[5] ~= '' then
    table.insert(fields, 'finished_ms'); table.insert(fields, ARGV[5])
    redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
  else
    redis.call('HDEL', KEYS[1], 'finished_ms')
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  if ARGV[6] ~= '' then table.insert(fields, 'outcome'); table.insert(fields, ARGV[6]) end
end
redis.call('HSET', KEYS[1], unpack(fields))
return seq
"#;

/// Applies a `Change`. Returns 0, or -1 for no stream.
/// KEYS: meta, abandon. ARGV: stream id, kind, value.
const CHANGE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local kind = ARGV[2]
local function raise(field)
  local old = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  if tonumber(ARGV[3]) > old then
    redis.call('HSET', KEYS[1], field, ARGV[3])
    return tonumber(ARGV[3])
  end
  return old
end
if kind == 'ack' then
  raise('acked')
elseif kind == 'request' then
  raise('last_request')
elseif kind == 'touch' then
  local touched = raise('touched_ms')
  local after = redis.call('HGET', KEYS[1], 'abandon_after_ms')
  if after then
    local at = string.format('%.0f', touched + tonumber(after))
    redis.call('HSET', KEYS[1], 'abandon_at_ms', at)
    redis.call('ZADD', KEYS[2], at, ARGV[1])
  end
elseif kind == 'coalesced' then
  redis.call('HSET', KEYS[1], 'coalesced', '1')
end
return 0
"#;

/// Deletes a stream and unindexes it.
/// KEYS: meta, log, session streams, all streams, abandon, finished, requests.
/// ARGV: stream id, then its request ids.
const DELETE: &str = r#"
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
for i = 2, #ARGV do
  local v = redis.call('HGET', KEYS[7], ARGV[i])
  if v and string.sub(v, -string.len(ARGV[1])) == ARGV[1] then
    redis.call('HDEL', KEYS[7], ARGV[i])
  end
end
return 0
"#;

impl Scripts {
    pub fn new() -> Self {
        Self {
            create: Script::new(CREATE),
            append: Script::new(APPEND),
            change: Script::new(CHANGE),
            delete: Script::new(DELETE),
        }
    }
}
