// The task page's chart: prompt tokens per model call against the window and the compression threshold.
// Data comes from the chart element's data-chart attribute (escaped by the template, never executed).
(function () {
  "use strict";
  function drawChart() {
    var el = document.getElementById("token-chart");
    if (!el || !window.uPlot) { return; }
    var data = JSON.parse(el.dataset.chart);
    var n = data.steps.length;
    var flat = function (v) { var a = []; for (var i = 0; i < n; i++) { a.push(v); } return a; };
    var opts = {
      width: Math.min(el.clientWidth || 800, 1000),
      height: 260,
      scales: { x: { time: false }, y: { range: [0, Math.max(data.window, Math.max.apply(null, data.prompt_tokens)) * 1.05] } },
      axes: [{ label: "model call", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, { label: "tokens", size: 70 }],
      series: [
        {},
        { label: "prompt tokens", stroke: "#2563eb", width: 2, points: { show: true } },
        { label: "window", stroke: "#dc2626", dash: [6, 4] },
        { label: "compression threshold", stroke: "#d97706", dash: [3, 3] }
      ]
    };
    new window.uPlot(opts, [data.steps, data.prompt_tokens, flat(data.window), flat(data.threshold)], el);
  }
  document.addEventListener("DOMContentLoaded", drawChart);
})();
