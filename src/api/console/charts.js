// Small SVG bar charts drawn with the DOM (no inline styles: the page's policy forbids them),
// and the TTFT histogram read from the `/metrics` text.

const SVG = 'http://www.w3.org/2000/svg';

function node(name, attributes, text) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

/**
 * Draws `bars` ({label, value, title, kind}) into `svg`, scaled to the largest value; `kind`
 * becomes a CSS class of the bar. `empty` is shown when there are none.
 */
export function barChart(svg, bars, { empty = 'nothing yet', format = String } = {}) {
  const width = 320;
  const height = 140;
  const top = 16;
  const bottom = 22;
  svg.replaceChildren();
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  if (bars.length === 0) {
    svg.append(node('text', { x: width / 2, y: height / 2, 'text-anchor': 'middle', class: 'chart-empty' }, empty));
    return;
  }
  const max = Math.max(...bars.map((bar) => bar.value), 1e-9);
  const slot = width / bars.length;
  const barWidth = Math.max(2, Math.min(40, slot * 0.7));
  const every = Math.ceil(bars.length / 12);
  bars.forEach((bar, i) => {
    const h = ((height - top - bottom) * bar.value) / max;
    const x = i * slot + (slot - barWidth) / 2;
    const y = height - bottom - h;
    const rect = node('rect', { x, y, width: barWidth, height: Math.max(h, 0.5), class: `bar ${bar.kind ?? ''}` });
    rect.append(node('title', {}, bar.title ?? `${bar.label}: ${format(bar.value)}`));
    svg.append(rect);
    if (i % every === 0) {
      svg.append(node('text', { x: x + barWidth / 2, y: height - 6, 'text-anchor': 'middle', class: 'chart-label' }, bar.label));
    }
    if (bars.length <= 12 && bar.value > 0) {
      svg.append(node('text', { x: x + barWidth / 2, y: y - 3, 'text-anchor': 'middle', class: 'chart-value' }, format(bar.value)));
    }
  });
  svg.append(node('line', { x1: 0, x2: width, y1: height - bottom, y2: height - bottom, class: 'axis' }));
}

/**
 * The buckets of histogram `name` in Prometheus text: `[{le, count}]` with each bucket's own
 * count (not cumulative), `+Inf` last; and the total count and sum.
 */
export function parseHistogram(text, name) {
  const cumulative = [];
  let count = 0;
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(`${name}_bucket{`)) {
      const le = /le="([^"]+)"/.exec(line)?.[1];
      const value = Number(line.slice(line.lastIndexOf('}') + 1).trim().split(' ')[0]);
      if (le !== undefined) cumulative.push({ le: le === '+Inf' ? Infinity : Number(le), value });
    } else if (line.startsWith(`${name}_count`)) {
      count = Number(line.split(' ')[1]);
    } else if (line.startsWith(`${name}_sum`)) {
      sum = Number(line.split(' ')[1]);
    }
  }
  cumulative.sort((a, b) => a.le - b.le);
  const buckets = cumulative.map((bucket, i) => ({ le: bucket.le, count: bucket.value - (i > 0 ? cumulative[i - 1].value : 0) }));
  return { buckets, count, sum };
}
