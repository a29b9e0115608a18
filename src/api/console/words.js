// What the numbers of a reply mean, in words. Pure functions: no page, no network.

const SOURCES = {
  live: 'continued the live cache',
  ram: 'restored from RAM',
  checkpoint: 'restored from a checkpoint',
  disk: 'restored from disk',
  kept: 'continued a conversation kept in its cells',
  none: 'nothing reused',
};

/** Why not more was reused, in words; `at` is the first prompt token that differed. */
function reasonInWords(reason, at) {
  const where = at == null ? '' : ` at token ${at}`;
  switch (reason) {
    case null:
    case undefined:
      return '';
    case 'cold':
      return 'nothing was cached yet';
    case 'system-prompt-changed':
      return `system prompt changed${where}`;
    case 'history-changed':
      return `an earlier turn changed${where}`;
    case 'prompt-shorter':
      return 'the prompt is shorter than what was cached (a regenerated reply)';
    case 'restored':
      return at == null ? '' : `differed from the stored state at token ${at}`;
    case 'checkpoint':
      return `went back to the newest checkpoint before token ${at ?? '?'}`;
    case 'swa-window':
      return 'the sliding window no longer held the shared prefix';
    case 'cannot-rewind':
      return 'recurrent state cannot be rewound and no checkpoint covered it';
    case 'evicted':
      return 'the entry that would have served it was evicted for the budget';
    case 'reply-cut':
      return `the prompt cut the reply the cache held${where}`;
    case 'media-changed':
      return `another image or clip${where}`;
    case 'reused-after-change':
      return `the prompt changed${where}; what follows the change was kept (approximate)`;
    case 'cannot-reuse-after-change':
      return `the prompt changed${where}; this cache cannot keep what follows a change`;
    case 'approximate-cells':
      return 'the cache held an approximate reuse past a change, which this request did not accept';
    default:
      return `${reason}${where}`;
  }
}

/** `timings.cache` of a reply (or a prefill) in words: where the reused tokens came from, and why not more. */
export function cacheInWords(cache) {
  if (!cache) return 'no cache report';
  const parts = [SOURCES[cache.source] ?? cache.source];
  const why = reasonInWords(cache.reason, cache.diverged_at);
  if (why) parts.push(why);
  else if (cache.diverged_at != null) parts.push(`diverged at token ${cache.diverged_at}`);
  if (cache.restore_ms != null) parts.push(`restore ${ms(cache.restore_ms)}`);
  if (cache.save_ms != null) parts.push(`saved the previous state in ${ms(cache.save_ms)}`);
  if (cache.adopted) parts.push(`took ${cache.adopted} tokens a prefill generated ahead`);
  if (cache.changes) {
    const spans = cache.changes.spans.length;
    parts.push(`kept ${cache.changes.kept} tokens past ${spans} changed span${spans === 1 ? '' : 's'} (${cache.changes.evaluated} evaluated again)`);
  }
  return parts.join('; ');
}

/** Milliseconds for people: `84 ms`, `1.25 s`. */
export function ms(value) {
  if (value == null || Number.isNaN(value)) return '–';
  return value < 1000 ? `${Math.round(value)} ms` : `${(value / 1000).toFixed(2)} s`;
}

/** Bytes for people: `512 B`, `94.1 MiB`. */
export function bytes(value) {
  if (value == null) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let n = value;
  let unit = 0;
  while (n >= 1024 && unit < units.length - 1) {
    n /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${n} B` : `${n.toFixed(1)} ${units[unit]}`;
}

/** How long ago a Unix time (seconds) was: `12 s ago`, `3 min ago`. */
export function ago(unixSeconds, now = Date.now() / 1000) {
  const s = Math.max(0, Math.round(now - unixSeconds));
  if (s < 90) return `${s} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

/** One reply's figures in a line: TTFT, decode rate, prompt tokens reused and evaluated. */
export function turnFigures({ ttftMs, timings, usage }) {
  const parts = [`TTFT ${ms(ttftMs)}`];
  if (timings) {
    if (timings.predicted_n > 0) parts.push(`decode ${timings.predicted_per_second.toFixed(1)} tok/s`);
    parts.push(`prompt ${timings.cache_n} reused / ${timings.prompt_n} evaluated`);
  } else if (usage) {
    const cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    parts.push(`prompt ${cached} reused / ${usage.prompt_tokens - cached} evaluated`);
  }
  return parts.join(' · ');
}
