// The task page's chart: prompt tokens per model call against the window and the compression threshold.
// Data comes from the chart element's data-chart attribute (escaped by the template, never executed); on a
// running task's page, each "chart" event of its stream adds the new calls' sizes (JSON, never markup).
(function () {
  "use strict";
  var plot = null;
  var data = null;

  function series() {
    var n = data.steps.length;
    var flat = function (v) { var a = []; for (var i = 0; i < n; i++) { a.push(v); } return a; };
    return [data.steps, data.prompt_tokens, flat(data.window), flat(data.threshold)];
  }

  function draw(el) {
    if (plot) { plot.setData(series()); return; }
    var opts = {
      width: Math.min(el.clientWidth || 800, 1000),
      height: 260,
      scales: {
        x: { time: false },
        y: { range: function (u, min, max) { return [0, Math.max(data.window, max) * 1.05]; } }
      },
      axes: [{ label: "model call", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, { label: "tokens", size: 70 }],
      series: [
        {},
        { label: "prompt tokens", stroke: "#2563eb", width: 2, points: { show: true } },
        { label: "window", stroke: "#dc2626", dash: [6, 4] },
        { label: "compression threshold", stroke: "#d97706", dash: [3, 3] }
      ]
    };
    plot = new window.uPlot(opts, series(), el);
  }

  function addPoints(el, sizes) {
    sizes.forEach(function (size) {
      data.steps.push(data.steps.length + 1);
      data.prompt_tokens.push(size);
    });
    el.dataset.steps = String(data.steps.length);
    var none = document.getElementById("no-calls");
    if (none) { none.hidden = true; }
    draw(el);
  }

  function start() {
    var el = document.getElementById("token-chart");
    if (!el || !window.uPlot) { return; }
    data = JSON.parse(el.dataset.chart);
    if (data.steps.length) { draw(el); }
    var feed = document.getElementById("chart-feed");
    if (!feed) { return; }
    feed.addEventListener("htmx:sseBeforeMessage", function (event) {
      event.preventDefault();  // the points go to the chart, nothing is swapped into the page
      addPoints(el, JSON.parse(event.detail.data).prompt_tokens);
    });
  }
  document.addEventListener("DOMContentLoaded", start);
})();

// The fleet page's outcomes chart: per week, the pull/merge requests tasks opened, merged and closed unmerged.
// Data comes from the chart element's data-chart attribute (escaped by the template, never executed).
(function () {
  "use strict";

  function start() {
    var el = document.getElementById("outcomes-chart");
    if (!el || !window.uPlot) { return; }
    var data = JSON.parse(el.dataset.chart);
    var opts = {
      width: Math.min(el.clientWidth || 800, 1000),
      height: 220,
      scales: { y: { range: function (u, min, max) { return [0, Math.max(max, 1) * 1.1]; } } },
      axes: [{ label: "week opened" }, { label: "requests", size: 60 }],
      series: [
        {},
        { label: "opened", stroke: "#2563eb", width: 2, points: { show: true } },
        { label: "merged", stroke: "#16a34a", width: 2, points: { show: true } },
        { label: "closed unmerged", stroke: "#dc2626", width: 2, points: { show: true } }
      ]
    };
    new window.uPlot(opts, [data.weeks, data.opened, data.merged, data.closed], el);
    el.dataset.drawn = "true";
  }
  document.addEventListener("DOMContentLoaded", start);
})();
