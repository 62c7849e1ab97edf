/* mxc report: draws the page's plot data (mxc/report/plots.py, in #mxc-data) with the inlined uPlot.
 * Zoom: drag across a plot; plots of one kind (per step, over time) follow; double-click zooms out.
 * Hover: a tooltip with every run's value, and a cursor on the other plots of the same kind.
 * Smoothing: TensorBoard's debiased exponential moving average; the raw curve stays, faded.
 * Log scale: per plot. The view (smoothing, log plots, zoom) is kept in the address, #smooth=..&log=..,
 * so a link shows what its sender saw. Nothing here reads the network or writes anything but the page.
 */
(function () {
  'use strict';

  const DATA = JSON.parse(document.getElementById('mxc-data').textContent);
  const HEIGHT = 260;
  const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2500, 5e3, 1e4, 2e4, 25e3, 5e4, 1e5, 2e5, 25e4,
                      5e5, 1e6, 2e6, 25e5, 5e6, 1e7, 2e7, 5e7, 1e8, 1e9];  // steps are whole numbers
  const charts = {};  // panel id -> {panel, fig, u}
  const state = readHash();
  let hovered = null;
  let syncing = false;

  // ---- the view in the address

  function readHash() {
    const out = {smooth: 0, log: null, zoom: {step: null, time: null}};
    const params = new URLSearchParams(location.hash.replace(/^#/, ''));
    const smooth = parseFloat(params.get('smooth'));
    if (isFinite(smooth)) out.smooth = Math.min(0.99, Math.max(0, smooth));
    if (params.has('log')) out.log = params.get('log').split(',').filter(Boolean);
    for (const group of ['step', 'time']) {
      const range = (params.get(group) || '').split('..').map(parseFloat);
      if (range.length === 2 && range.every(isFinite) && range[0] < range[1]) out.zoom[group] = range;
    }
    return out;
  }

  function writeHash() {
    const parts = [];
    if (state.smooth > 0) parts.push('smooth=' + state.smooth);
    if (state.log !== null) parts.push('log=' + state.log.join(','));
    for (const group of ['step', 'time']) {
      const z = state.zoom[group];
      if (z) parts.push(group + '=' + round(z[0]) + '..' + round(z[1]));
    }
    try {
      history.replaceState(null, '', parts.length ? '#' + parts.join('&') : location.pathname + location.search);
    } catch (e) { /* a file: URL in some browsers: the view still works, the address does not follow */ }
  }

  function round(x) { return Math.round(x * 1000) / 1000; }

  function isLog(panel) {
    return state.log === null ? panel.log : state.log.indexOf(panel.id) >= 0;
  }

  // ---- numbers

  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return '-';
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(3);
    if (a >= 1e4) return Math.round(v).toLocaleString('en-US');
    return String(+v.toPrecision(5));
  }

  function fmtAxis(v) {
    if (v === null || !isFinite(v)) return '';
    const a = Math.abs(v);
    if (a === 0) return '0';
    if (a >= 1e9) return +(v / 1e9).toPrecision(3) + 'G';
    if (a >= 1e6) return +(v / 1e6).toPrecision(3) + 'M';
    if (a >= 1e4) return +(v / 1e3).toPrecision(3) + 'k';
    if (a < 1e-3) return v.toExponential(1);
    return String(+v.toPrecision(4));
  }

  function fmtSeconds(s) {
    if (!isFinite(s)) return '';
    const sign = s < 0 ? '-' : '';
    s = Math.abs(s);
    if (s < 120) return sign + (+s.toFixed(1)) + ' s';
    const m = Math.floor(s / 60);
    if (m < 120) return sign + m + ':' + String(Math.floor(s % 60)).padStart(2, '0');
    return sign + Math.floor(m / 60) + ' h ' + String(m % 60).padStart(2, '0');
  }

  function xLabel(panel, x) {
    return panel.x === 'step' ? 'step ' + Math.round(x).toLocaleString('en-US') : fmtSeconds(x) + ' since start';
  }

  // ---- smoothing (TensorBoard's: an EMA over the finite points, divided by 1 - w^n to undo its start at 0)

  function smooth(ys, w) {
    if (!(w > 0)) return ys;
    const out = new Array(ys.length);
    let last = 0, n = 0;
    for (let i = 0; i < ys.length; i++) {
      const y = ys[i];
      if (y === null || !isFinite(y)) { out[i] = null; continue; }
      last = last * w + (1 - w) * y;
      n += 1;
      out[i] = last / (1 - Math.pow(w, n));
    }
    return out;
  }

  function positive(ys) { return ys.map(y => (y !== null && y > 0 ? y : null)); }

  // ---- one chart

  function colorOf(run, alpha) {
    const hex = DATA.runs[run].color;
    if (alpha === undefined) return hex;
    const n = parseInt(hex.slice(1), 16);
    return 'rgba(' + (n >> 16) + ',' + ((n >> 8) & 255) + ',' + (n & 255) + ',' + alpha + ')';
  }

  function smoothing(panel) { return panel.smooth && state.smooth > 0; }

  // uPlot series: x, then per panel series its curve, and (smoothable panels) its raw curve after it
  function chartData(panel) {
    const xs = panel.data[0];
    const log = isLog(panel);
    const out = [xs];
    panel.series.forEach((s, k) => {
      const raw = log ? positive(panel.data[k + 1]) : panel.data[k + 1];
      if (panel.smooth) {
        out.push(smoothing(panel) ? smooth(raw, state.smooth) : raw);
        out.push(raw);
      } else {
        out.push(raw);
      }
    });
    return out;
  }

  function seriesOpts(panel) {
    const out = [{label: panel.x}];
    panel.series.forEach(s => {
      const dash = s.dash ? [6, 4] : undefined;
      out.push({label: s.label, stroke: () => colorOf(s.run), width: 1.8, dash: dash, spanGaps: true,
                points: {show: false}});
      if (panel.smooth) {
        out.push({label: s.label + ' (raw)', stroke: () => colorOf(s.run, smoothing(panel) ? 0.22 : 0),
                  width: 1.2, dash: dash, spanGaps: true, points: {show: false}});
      }
    });
    return out;
  }

  function yRange(panel) {
    const floor = panel.y_span[0], ceiling = panel.y_span[1];
    return (u, min, max) => {
      if (min === null || max === null) return [floor !== null ? floor : 0, ceiling !== null ? ceiling : 1];
      if (panel.clip_top !== null && max > panel.clip_top) max = panel.clip_top;
      let low, high;
      if (min === max) {
        const pad = Math.abs(min) * 0.1 || 1;
        low = min - pad; high = max + pad;
      } else {
        const pad = (max - min) * 0.06;
        low = min >= 0 && min - pad < 0 ? 0 : min - pad;
        high = max + pad;
      }
      if (floor !== null) low = Math.min(low, floor);
      if (ceiling !== null) high = Math.max(Math.min(high, ceiling * 1.02), ceiling);
      return [low, high];
    };
  }

  function drawBands(panel) {
    return u => {
      const ctx = u.ctx, b = u.bbox;
      ctx.save();
      for (const band of panel.bands) {
        const x0 = Math.max(b.left, u.valToPos(band.from, 'x', true));
        const x1 = Math.min(b.left + b.width, u.valToPos(band.to, 'x', true));
        if (x1 > x0) { ctx.fillStyle = colorOf(band.run, 0.07); ctx.fillRect(x0, b.top, x1 - x0, b.height); }
      }
      ctx.restore();
    };
  }

  const MARK = {restart: ['restart', [5, 4]], diverge: ['differs', [2, 3]], nonfinite: ['not finite', []]};

  function drawMarkers(panel) {
    return u => {
      const ctx = u.ctx, b = u.bbox, px = devicePixelRatio || 1;
      const rows = [], labelled = new Set();  // labels side by side would overlap: later ones go a row down
      ctx.save();
      ctx.font = (10 * px) + 'px system-ui, sans-serif';
      ctx.textBaseline = 'top';
      const marks = panel.markers.map(m => ({m: m, x: Math.round(u.valToPos(m.x, 'x', true))}))
        .filter(e => e.x >= b.left && e.x <= b.left + b.width).sort((a, c) => a.x - c.x);
      for (const {m, x} of marks) {
        const style = MARK[m.kind] || ['', []];
        const color = m.kind === 'nonfinite' ? '#b91c1c' : m.kind === 'diverge' ? '#4b5563' : colorOf(m.run);
        ctx.strokeStyle = color;
        ctx.fillStyle = color;
        ctx.lineWidth = 1.2 * px;
        ctx.setLineDash(style[1].map(d => d * px));
        ctx.beginPath();
        ctx.moveTo(x + 0.5, b.top);
        ctx.lineTo(x + 0.5, b.top + b.height);
        ctx.stroke();
        const key = m.kind + '@' + x;
        if (labelled.has(key)) continue;
        labelled.add(key);
        const width = ctx.measureText(style[0]).width, start = x + 3 * px;
        let row = rows.findIndex(end => end < start);
        if (row < 0) { row = rows.length; rows.push(0); }
        rows[row] = start + width + 4 * px;
        ctx.fillText(style[0], start, b.top + (2 + 12 * row) * px);
      }
      ctx.restore();
    };
  }

  function tooltip(entry) {
    return u => {
      const tip = entry.fig.querySelector('.tooltip');
      const i = u.cursor.idx;
      if (hovered !== u || i === null || i === undefined) { tip.hidden = true; return; }
      const panel = entry.panel;
      tip.replaceChildren();
      const head = document.createElement('div');
      head.className = 'x';
      head.textContent = xLabel(panel, u.data[0][i]);
      tip.appendChild(head);
      let col = 1, rows = 0;
      panel.series.forEach(s => {
        const value = u.data[col][i];
        const raw = panel.smooth ? u.data[col + 1][i] : null;
        col += panel.smooth ? 2 : 1;
        if (value === null || value === undefined) return;
        const row = document.createElement('div');
        row.className = 'row';
        const sw = document.createElement('span');
        sw.className = 'swatch run-' + s.run;
        row.appendChild(sw);
        row.appendChild(document.createTextNode(s.label + '  ' + fmt(value)));
        if (smoothing(panel) && raw !== null) {
          const r = document.createElement('span');
          r.className = 'raw';
          r.textContent = 'raw ' + fmt(raw);
          row.appendChild(r);
        }
        tip.appendChild(row);
        rows += 1;
      });
      for (const m of panel.markers) {
        if (Math.abs(u.valToPos(m.x, 'x') - u.cursor.left) < 4) {
          const row = document.createElement('div');
          row.className = 'x';
          row.textContent = m.label;
          tip.appendChild(row);
          rows += 1;
        }
      }
      if (!rows) { tip.hidden = true; return; }
      tip.hidden = false;
      const over = u.over.getBoundingClientRect(), fig = entry.fig.getBoundingClientRect();
      let left = over.left - fig.left + u.cursor.left + 14;
      if (left + tip.offsetWidth > fig.width - 4) left = over.left - fig.left + u.cursor.left - tip.offsetWidth - 14;
      tip.style.left = Math.max(4, left) + 'px';
      tip.style.top = Math.max(4, over.top - fig.top + u.cursor.top - tip.offsetHeight / 2) + 'px';
    };
  }

  function extent(panel) {
    const xs = panel.data[0];
    return xs.length ? [xs[0], xs[xs.length - 1]] : null;
  }

  // Set x ranges without the charts' hooks answering: uPlot fires hooks from a microtask, but
  // batch() commits (and fires) at once, inside the guard.
  function setRanges(entries, rangeOf) {
    syncing = true;
    try {
      for (const e of entries) {
        const range = rangeOf(e);
        if (e.u && range) e.u.batch(() => e.u.setScale('x', {min: range[0], max: range[1]}));
      }
    } finally { syncing = false; }
  }

  function shown(entry, u) {  // the x range on the figure: what a reader (or a test) sees
    entry.fig.setAttribute('data-x-range', round(u.scales.x.min) + '..' + round(u.scales.x.max));
  }

  // a zoom (or a zoom-out) in one chart: the others of its kind follow, the address remembers it
  function zoomed(entry, u) {
    if (syncing || !entry.live) return;
    const group = entry.panel.x, min = u.scales.x.min, max = u.scales.x.max;
    const full = extent(entry.panel);
    const whole = !full || (min <= full[0] && max >= full[1]);
    state.zoom[group] = whole ? null : [min, max];
    const others = Object.values(charts).filter(e => e !== entry && e.panel.x === group);
    setRanges(others, e => (whole ? extent(e.panel) : [min, max]));
    writeHash();
  }

  function build(entry) {
    const panel = entry.panel, box = entry.fig.querySelector('.chart');
    const log = isLog(panel), zoom = state.zoom[panel.x];
    if (entry.u) { entry.u.destroy(); entry.u = null; }
    entry.live = false;  // uPlot's first commit (a microtask) fires setScale: not a zoom by the reader
    box.replaceChildren();
    const opts = {
      width: Math.max(320, box.clientWidth || 560),
      height: HEIGHT,
      legend: {show: false},
      cursor: {sync: {key: 'mxc-' + panel.x, setSeries: false}, drag: {x: true, y: false}, points: {size: 6}},
      scales: {x: zoom ? {time: false, min: zoom[0], max: zoom[1]} : {time: false},
               y: log ? {distr: 3, log: 10} : {range: yRange(panel)}},
      axes: [
        {label: panel.x === 'step' ? 'step' : 'time since the run started', labelSize: 18, size: 36,
         incrs: panel.x === 'step' ? STEP_INCRS : undefined,
         values: (u, splits) => splits.map(v => (panel.x === 'step' ? fmtAxis(v) : fmtSeconds(v))),
         grid: {stroke: '#eef0f3'}, ticks: {stroke: '#d9dde3'}},
        {size: 58, values: (u, splits) => splits.map(fmtAxis), grid: {stroke: '#eef0f3'}, ticks: {stroke: '#d9dde3'}},
      ],
      series: seriesOpts(panel),
      hooks: {drawClear: [drawBands(panel)], draw: [drawMarkers(panel)], setCursor: [tooltip(entry)],
              setScale: [(u, key) => { if (key === 'x') { shown(entry, u); zoomed(entry, u); } }]},
    };
    entry.u = new uPlot(opts, chartData(panel), box);
    queueMicrotask(() => { entry.live = true; });  // after uPlot's own, queued by the constructor
    entry.u.over.addEventListener('mouseenter', () => { hovered = entry.u; });
    entry.u.over.addEventListener('mouseleave', () => {
      hovered = null;
      entry.fig.querySelector('.tooltip').hidden = true;
    });
    entry.fig.setAttribute('data-y-scale', entry.u.scales.y.distr === 3 ? 'log' : 'linear');
    entry.fig.setAttribute('data-series', String(panel.series.length));
    entry.fig.setAttribute('data-state', 'drawn');
  }

  // ---- the page

  function restyle() {  // smoothing changed: new curves, same zoom
    for (const id in charts) {
      const entry = charts[id];
      if (entry.panel.smooth && entry.u) entry.u.setData(chartData(entry.panel), false);
      if (entry.u) entry.u.redraw(true, false);
    }
    document.documentElement.setAttribute('data-mxc-smoothing', String(state.smooth));
  }

  function controls() {
    const nav = document.getElementById('controls');
    if (!nav) return;
    nav.hidden = false;
    const slider = document.getElementById('smoothing'), shown = document.getElementById('smoothing-value');
    slider.value = String(state.smooth);
    shown.textContent = state.smooth > 0 ? state.smooth.toFixed(2) : 'off';
    let pending = false;
    slider.addEventListener('input', () => {
      state.smooth = parseFloat(slider.value) || 0;
      shown.textContent = state.smooth > 0 ? state.smooth.toFixed(2) : 'off';
      if (!pending) {
        pending = true;
        requestAnimationFrame(() => { pending = false; restyle(); writeHash(); });
      }
    });
    document.getElementById('reset-zoom').addEventListener('click', () => {
      state.zoom = {step: null, time: null};
      setRanges(Object.values(charts), e => extent(e.panel));
      writeHash();
    });
  }

  function start() {
    let drawn = 0;
    for (const panel of DATA.panels) {
      const fig = document.getElementById('panel-' + panel.id);
      if (!fig) continue;
      const entry = {panel: panel, fig: fig, u: null, live: false};
      charts[panel.id] = entry;
      const toggle = fig.querySelector('.log-toggle');
      toggle.checked = isLog(panel);
      toggle.addEventListener('change', () => {
        const logs = DATA.panels.filter(p => (p === panel ? toggle.checked : isLog(p))).map(p => p.id);
        state.log = logs;
        build(entry);
        writeHash();
      });
      build(entry);
      drawn += 1;
    }
    controls();
    document.documentElement.setAttribute('data-mxc-smoothing', String(state.smooth));
    let resizing = false;
    window.addEventListener('resize', () => {
      if (resizing) return;
      resizing = true;
      requestAnimationFrame(() => {
        resizing = false;
        for (const id in charts) {
          const e = charts[id], box = e.fig.querySelector('.chart');
          if (e.u) e.u.setSize({width: Math.max(320, box.clientWidth || 560), height: HEIGHT});
        }
      });
    });
    document.documentElement.setAttribute('data-mxc-rendered', String(drawn));
  }

  start();
})();
