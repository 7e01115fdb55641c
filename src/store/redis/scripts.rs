//! The Lua scripts of the Redis backend: each is one atomic step on a
//! stream's keys (and the global indexes it must keep in step), so that no
//! reader ever sees half a write. Scripts only move cursors and times
//! forward, and write back the caller's own strings for numbers they compare
//! (Lua numbers are doubles, exact below 2^53).
//!
//! Every write other instances must learn about also adds a line to the
//! feed (`P:feed`, a capped Redis Stream) in the same script: what changed
//! and which instance changed it. Leases are timed by Redis' own clock
//! (`TIME`), so instances whose clocks disagree still agree on who is dead.

use redis::Script;

pub(super) struct Scripts {
    pub create: Script,
    pub append: Script,
    pub change: Script,
    pub delete: Script,
    pub task: Script,
    pub renew: Script,
    pub claim: Script,
}

/// How many changes the feed keeps (approximately). A listener further
/// behind than that re-reads its streams' metadata instead (see
/// `follow.rs`).
pub(super) const FEED_LENGTH: u32 = 100_000;

/// Helpers every script may use. Keys computed here name no declared slot:
/// these scripts need one Redis primary (see the module's limits).
const PRELUDE: &str = r#"
local function owned(prefix, instance) return prefix .. ':owned:' .. instance end
local function feed(key, ...)
  redis.call('XADD', key, 'MAXLEN', '~', FEED_LENGTH, '*', ...)
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Extends an instance's lease to now + lease_ms (never shortens it); a
-- retired instance (score 0) stays retired. Returns the new expiry, or -1.
local function renew_lease(instances, instance, lease_ms)
  local held = redis.call('ZSCORE', instances, instance)
  if held == '0' then return -1 end
  local until_ms = now_ms() + tonumber(lease_ms)
  if not held or until_ms > tonumber(held) then
    redis.call('ZADD', instances, until_ms, instance)
  end
  return until_ms
end
"#;

/// Creates (or replaces) a stream's metadata and indexes it; a live stream
/// is owned by the instance that creates it, whose lease is extended with
/// it (so no new stream has an owner nobody knows, nor one whose lease ran
/// out a moment ago). A task leg is never indexed for retention, and its
/// keys live as long as its task's (when the task is stored already).
///
/// A call that may repeat one of the session's (a client re-sending it) is
/// checked first, in the same step: when the session's stream under its one
/// request id is retained and has a params digest, that stream is the
/// call's prior and nothing is created. Returns `{0, ''}` when it created
/// the stream, `{1, prior}` for the same call (same digest), `{2, prior}`
/// for another call under the id.
///
/// The stream's opening entries (seqs 1, 2, …) are written in the same
/// step; nobody follows a stream before it exists, so the feed is not told.
/// KEYS: meta, session streams, all streams, abandon, finished, requests,
/// the creator's owned set, instances, log, and for a task leg its task.
/// ARGV: stream id, created_ms, abandon_at ('' none), finished_ms ('' none),
/// instance, lease ms, check for a prior ('1'/'0'), the call's params
/// digest ('' none), prefix, number of field/value pairs, the pairs, number
/// of opening entries, the entries, then the request ids (exactly one when
/// checking for a prior).
const CREATE: &str = r#"
if ARGV[7] == '1' then
  local old = redis.call('HGET', KEYS[6], ARGV[#ARGV])
  local space = old and string.find(old, ' ', 1, true)
  if space then
    local prior = string.sub(old, space + 1)
    local record = redis.call('HGET', '{' .. ARGV[9] .. ':' .. prior .. '}:meta', 'record')
    local digest = record and cjson.decode(record).params_digest
    if type(digest) == 'string' then
      if digest == ARGV[8] then return {1, prior} end
      return {2, prior}
    end
  end
end
redis.call('DEL', KEYS[1])
local n = tonumber(ARGV[10])
local i = 11
for _ = 1, n do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local opening = tonumber(ARGV[i])
i = i + 1
if opening > 0 then
  redis.call('DEL', KEYS[9])
  local bytes = 0
  for seq = 1, opening do
    redis.call('XADD', KEYS[9], '0-' .. string.format('%d', seq), 'm', ARGV[i])
    bytes = bytes + string.len(ARGV[i])
    i = i + 1
  end
  redis.call('HSET', KEYS[1], 'entries', string.format('%d', opening), 'bytes', string.format('%d', bytes))
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1]) end
local task = KEYS[10]
if task then
  local ttl = redis.call('PTTL', task)
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl)
    if opening > 0 then redis.call('PEXPIRE', KEYS[9], ttl) end
  end
end
if ARGV[4] ~= '' then
  if not task then redis.call('ZADD', KEYS[5], ARGV[4], ARGV[1]) end
else
  redis.call('SADD', KEYS[7], ARGV[1])
  renew_lease(KEYS[8], ARGV[5], ARGV[6])
end
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
return {0, ''}
"#;

/// Appends messages, counts them, records the upstream mark and a status
/// change, all or nothing, and tells the feed. Only a stream's owner logs
/// upstream messages or marks (a status alone may come from any instance:
/// a cancellation, an abandonment). Returns the last seq; -1 for no stream;
/// -2 when the writer does not own the stream (another instance took it
/// over); -3, writing nothing, when the messages would take the stream past
/// the caps given.
/// A finished stream's keys expire a while after its retention (a backstop:
/// the sweeper deletes it first, indexes and all, while any instance runs).
/// A task leg (its metadata has `task`) is deleted with its task instead:
/// never indexed for retention, its keys keep the TTL its task gave them.
/// KEYS: meta, log, finished, feed.
/// ARGV: stream id, has mark ('1'/'0'), mark event id, status ('' none),
/// finished_ms ('' when live), outcome ('' none), instance, prefix, TTL ms
/// of a finished stream, most entries and most bytes ('' for no caps), then
/// the messages.
const APPEND: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[7] and (#ARGV > 11 or ARGV[2] == '1') then return -2 end
local leg = redis.call('HEXISTS', KEYS[1], 'task') == 1
local seq = tonumber(redis.call('HGET', KEYS[1], 'entries') or '0')
local added = 0
for i = 12, #ARGV do added = added + string.len(ARGV[i]) end
if ARGV[10] ~= '' then
  local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
  if seq + #ARGV - 11 > tonumber(ARGV[10]) or bytes + added > tonumber(ARGV[11]) then return -3 end
end
for i = 12, #ARGV do
  seq = seq + 1
  redis.call('XADD', KEYS[2], '0-' .. string.format('%d', seq), 'm', ARGV[i])
end
local fields = {'entries', string.format('%d', seq)}
if added > 0 then
  redis.call('HINCRBY', KEYS[1], 'bytes', added)
  if leg then
    -- The log may have been made just now by XADD, without the TTL the
    -- leg's metadata has from its task.
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
  end
end
if ARGV[2] == '1' then
  table.insert(fields, 'up_event'); table.insert(fields, ARGV[3])
  table.insert(fields, 'up_seq'); table.insert(fields, string.format('%d', seq))
end
local finished = ''
if ARGV[4] ~= '' then
  table.insert(fields, 'status'); table.insert(fields, ARGV[4])
  if ARGV[5] ~= '' then
    finished = '1'
    table.insert(fields, 'finished_ms'); table.insert(fields, ARGV[5])
    if owner then redis.call('SREM', owned(ARGV[8], owner), ARGV[1]) end
    if not leg then
      redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
      redis.call('PEXPIRE', KEYS[1], ARGV[9])
      redis.call('PEXPIRE', KEYS[2], ARGV[9])
    end
  else
    finished = '0'
    redis.call('HDEL', KEYS[1], 'finished_ms')
    redis.call('ZREM', KEYS[3], ARGV[1])
    if not leg then
      redis.call('PERSIST', KEYS[1])
      redis.call('PERSIST', KEYS[2])
    end
  end
  if ARGV[6] ~= '' then table.insert(fields, 'outcome'); table.insert(fields, ARGV[6]) end
end
redis.call('HSET', KEYS[1], unpack(fields))
feed(KEYS[4], 'i', ARGV[7], 's', ARGV[1], 'q', string.format('%d', seq), 'f', finished)
return seq
"#;

/// Applies a `Change`. Returns 0, or -1 for no stream.
/// KEYS: meta, abandon, feed. ARGV: stream id, kind, value, instance.
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
  feed(KEYS[3], 'i', ARGV[4], 's', ARGV[1], 'c', '1')
end
return 0
"#;

/// Deletes a stream and unindexes it, and tells the feed it is gone.
/// KEYS: meta, log, session streams, all streams, abandon, finished,
/// requests, feed.
/// ARGV: stream id, instance, prefix, then its request ids.
const DELETE: &str = r#"
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner then redis.call('SREM', owned(ARGV[3], owner), ARGV[1]) end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
for i = 4, #ARGV do
  local v = redis.call('HGET', KEYS[7], ARGV[i])
  if v and string.sub(v, -string.len(ARGV[1])) == ARGV[1] then
    redis.call('HDEL', KEYS[7], ARGV[i])
  end
end
feed(KEYS[8], 'i', ARGV[2], 's', ARGV[1], 'g', '1')
return 0
"#;

/// Writes a task record; with an expected version, only over a stored
/// record of that version (compare-and-set: versions are compared as the
/// caller's decimal strings, never as Lua numbers). The record's key, and
/// the keys of the legs it names, expire at the task's expiry plus slack (a
/// backstop: the sweeper deletes the task and its legs first). No owner is
/// checked: any instance may update any task.
/// KEYS: task, tasks (the expiry index).
/// ARGV: task id, expected version ('' for none: create or replace),
/// version, record, expires_ms, TTL ms, prefix, then the legs' stream ids.
/// Returns 1 when written, 0 when not.
const TASK: &str = r#"
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'record', ARGV[4], 'version', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
for i = 8, #ARGV do
  local tag = '{' .. ARGV[7] .. ':' .. ARGV[i] .. '}'
  redis.call('PEXPIRE', tag .. ':meta', ARGV[6])
  redis.call('PEXPIRE', tag .. ':log', ARGV[6])
end
return 1
"#;

/// Renews an instance's lease: it is alive until Redis' clock passes the
/// returned time; -1 for a retired instance, which never renews. (An
/// instance whose lease ran out while it could not reach Redis renews like
/// any other: the streams others took over meanwhile are theirs, and its
/// own writes to them are refused.)
/// KEYS: instances. ARGV: instance, lease ms.
const RENEW: &str = r#"
return renew_lease(KEYS[1], ARGV[1], ARGV[2])
"#;

/// Hands the live streams of dead instances (lease passed) to this one:
/// their owner becomes this instance, so exactly one instance takes each
/// over. They also go into this instance's pending set, which it empties
/// only once it has read them: a claim whose answer is lost is found again
/// at the next look.
/// KEYS: instances, this instance's pending set.
/// ARGV: instance, prefix, lease ms.
const CLAIM: &str = r#"
renew_lease(KEYS[1], ARGV[1], ARGV[3])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms())
for _, instance in ipairs(dead) do
  if instance ~= ARGV[1] then
    local theirs = owned(ARGV[2], instance)
    for _, stream in ipairs(redis.call('SMEMBERS', theirs)) do
      local meta = '{' .. ARGV[2] .. ':' .. stream .. '}:meta'
      if redis.call('HGET', meta, 'owner') == instance then
        redis.call('HSET', meta, 'owner', ARGV[1])
        redis.call('SADD', owned(ARGV[2], ARGV[1]), stream)
        redis.call('SADD', KEYS[2], stream)
      end
    end
    redis.call('DEL', theirs, ARGV[2] .. ':claimed:' .. instance)
    redis.call('ZREM', KEYS[1], instance)
  end
end
return 0
"#;

fn script(body: &str) -> Script {
    Script::new(&format!(
        "local FEED_LENGTH = {FEED_LENGTH}\n{PRELUDE}\n{body}"
    ))
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            create: script(CREATE),
            append: script(APPEND),
            change: script(CHANGE),
            delete: script(DELETE),
            task: script(TASK),
            renew: script(RENEW),
            claim: script(CLAIM),
        }
    }
}
