// The run page: curves that grow as rounds are recorded (server-sent events from
// /api/runs/RUN/events), the run's status, its refused updates, its alerts and,
// when a deployment server runs it, that server's live state. Whether that server
// is live, and how long ago it wrote, the dashboard judges by its own clock (the
// browser's may be off): the page shows what it is sent.
"use strict";

(function () {
  const page = document.getElementById("run-page");
  const base = "/api/runs/" + encodeURIComponent(page.dataset.runId);
  const CONFIG = { displaylogo: false, responsive: true };
  // each plot: its div and traces as [row field, legend name]
  const PLOTS = [
    { id: "plot-accuracy", title: "Test accuracy", traces: [["test_accuracy", "test accuracy"]],
      yaxis: { tickformat: ".0%", rangemode: "tozero" } },
    { id: "plot-loss", title: "Loss", traces: [["train_loss", "train"], ["test_loss", "test"]],
      yaxis: { rangemode: "tozero" } },
    { id: "plot-bytes", title: "Bytes per round", traces: [["bytes_up", "up"], ["bytes_down", "down"]],
      yaxis: { rangemode: "tozero", tickformat: "~s", ticksuffix: "B" } },
  ];
  const FEW_ROUNDS = 12; // up to this many, a tick per round (never half rounds)
  let plotted = 0; // rounds on the plots

  function byId(id) { return document.getElementById(id); }

  function plural(n, noun) { return `${n} ${noun}${n === 1 ? "" : "s"}`; }

  function showError(text) {
    byId("error").textContent = text;
    byId("error").hidden = !text;
  }

  function xaxis(count) {
    return { title: { text: "round" }, rangemode: "tozero", dtick: count <= FEW_ROUNDS ? 1 : null };
  }

  function draw(rows) {
    plotted = rows.length;
    for (const plot of PLOTS) {
      const traces = plot.traces.map(([field, name]) => ({
        x: rows.map((r) => r.round), y: rows.map((r) => r[field]), name: name,
        type: "scatter", mode: "lines+markers", connectgaps: true,
      }));
      const layout = {
        title: { text: plot.title }, margin: { t: 40, r: 20, b: 80, l: 60 },
        xaxis: xaxis(rows.length), yaxis: plot.yaxis,
        legend: { orientation: "h", y: -0.3 },
      };
      Plotly.react(byId(plot.id), traces, layout, CONFIG);
    }
  }

  function extend(rows) {
    if (!rows.length) return;
    const few = plotted <= FEW_ROUNDS;
    plotted += rows.length;
    for (const plot of PLOTS) {
      const div = byId(plot.id);
      const update = {
        x: plot.traces.map(() => rows.map((r) => r.round)),
        y: plot.traces.map(([field]) => rows.map((r) => r[field])),
      };
      Plotly.extendTraces(div, update, plot.traces.map((_, i) => i));
      if (few && plotted > FEW_ROUNDS) Plotly.relayout(div, { "xaxis.dtick": null });
    }
  }

  function showStatus(s) {
    const status = byId("status");
    status.textContent = s.status;
    status.className = "status " + s.status;
    byId("progress").textContent =
      `rounds ${s.rounds_done}/${s.rounds_planned ?? "?"}, best ${s.best}`;
    loadSummary();
  }

  function fillTable(body, pairs, empty) {
    body.replaceChildren();
    for (const [label, value] of pairs.length ? pairs : [[empty, ""]]) {
      const row = body.insertRow();
      row.insertCell().textContent = label;
      const count = row.insertCell();
      count.textContent = value;
      count.className = "num";
    }
  }

  function showAnomalies(a) {
    byId("anomaly-total").textContent =
      `${plural(a.refused, "update")} refused (${plural(a.clients, "client")}), ` +
      `${plural(a.skipped_rounds, "round")} skipped`;
    fillTable(document.querySelector("#anomaly-reasons tbody"),
      a.by_reason.map((g) => [g.reason, g.count]), "none");
  }

  function fact(dl, key, label, value) {
    const dt = document.createElement("dt");
    dt.textContent = label;
    const dd = document.createElement("dd");
    dd.id = "dep-" + key;
    dd.textContent = value;
    dl.append(dt, dd);
  }

  function showLive(live) {
    const panel = byId("deployment");
    panel.hidden = live === null;
    if (live === null) return;
    const state = byId("dep-state");
    state.textContent = live.condition;
    state.className = "status " + (live.condition === "live" ? "live" : "gone");
    const dl = byId("dep-facts");
    dl.replaceChildren();
    fact(dl, "phase", "phase", live.phase ?? "-");
    // counts and id ranges, made by the dashboard: one line at any number of clients
    fact(dl, "connected", "connected clients", live.connected_text);
    fact(dl, "joined", "joined", live.joined_text);
    if (live.away_text !== undefined) fact(dl, "away", "not connected", live.away_text);
    fact(dl, "dropouts", "dropouts", String(live.dropouts ?? 0));
    fact(dl, "accepted", "answers taken", String(live.accepted ?? 0));
    fact(dl, "address", "address", live.address ?? "-");
    fact(dl, "updated", "updated", live.age_s === null ? "-" : `${live.age_s.toFixed(1)} s ago`);
    const refused = Object.entries(live.refused ?? {}).sort((a, b) => b[1] - a[1]);
    fillTable(document.querySelector("#dep-refused tbody"), refused, "none");
  }

  function showAlerts(a) {
    byId("alert-total").textContent = a.total > a.rows.length
      ? `${plural(a.total, "alert")} fired; the newest ${a.rows.length}:`
      : `${plural(a.total, "alert")} fired`;
    byId("alert-rows").hidden = a.rows.length === 0;
    const body = document.querySelector("#alert-rows tbody");
    body.replaceChildren();
    for (const alert of a.rows) {
      const row = body.insertRow();
      for (const value of [alert.round, alert.rule, alert.message, alert.outcome]) {
        row.insertCell().textContent = value;
      }
      row.cells[0].className = "num";
    }
  }

  async function loadSummary() {
    try {
      const answer = await fetch(base, { credentials: "same-origin" });
      const detail = await answer.json();
      if (!answer.ok) throw new Error(detail.error || answer.statusText);
      byId("summary").textContent = detail.summary;
    } catch (exc) {
      byId("summary").textContent = "no summary: " + exc.message;
    }
  }

  const events = new EventSource(base + "/events");
  const on = (name, show) =>
    events.addEventListener(name, (e) => { showError(""); show(JSON.parse(e.data)); });
  on("rounds", (m) => (m.reset ? draw(m.rows) : extend(m.rows)));
  on("status", showStatus);
  on("anomalies", showAnomalies);
  on("alerts", showAlerts);
  on("live", showLive);
  on("failure", (m) => { events.close(); showError(m.error); });
  events.onerror = () => {
    if (events.readyState !== EventSource.CLOSED) showError("reconnecting to the dashboard...");
  };
})();
