// The runs page: the `fedforge runs` table, refreshed every few seconds from /api/runs.
"use strict";

(function () {
  const REFRESH_MS = 3000;
  const body = document.querySelector("#runs tbody");
  const none = document.getElementById("no-runs");
  const error = document.getElementById("error");

  function cell(row, text, className) {
    const td = row.insertCell();
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function render(listing) {
    body.replaceChildren();
    for (const run of listing.runs) {
      const row = body.insertRow();
      row.dataset.runId = run.run_id;
      const link = document.createElement("a");
      link.href = "/runs/" + encodeURIComponent(run.run_id);
      link.textContent = run.run_id;
      cell(row, "").appendChild(link);
      cell(row, run.status, "status " + run.status);
      cell(row, run.algorithm);
      cell(row, run.mode);
      cell(row, run.rounds, "num");
      cell(row, run.best, "num");
      cell(row, run.created);
    }
    none.hidden = listing.runs.length > 0;
  }

  async function refresh() {
    try {
      const answer = await fetch("/api/runs", { credentials: "same-origin" });
      const listing = await answer.json();
      if (!answer.ok) throw new Error(listing.error || answer.statusText);
      render(listing);
      error.hidden = true;
    } catch (exc) {
      error.textContent = "cannot list the runs: " + exc.message;
      error.hidden = false;
    }
    setTimeout(refresh, REFRESH_MS);
  }

  refresh();
})();
