// What the pages that run an imported ONNX model share (/onnx/ and the model page `cinders
// export-web model.onnx` ships). inputTable: one row per graph input with its name, type, shape
// (fixed dims as text, symbolic ones such as the batch as number fields) and values as JSON,
// prefilled with cinders.onnx.web's example values and refilled when a dim changes.
// outputText: the outputs of a run, their first values.
//
//   const fields = inputTable($("inputs"), onnxWeb, pyodide, info.inputs);
//   const result = plain(await onnxWeb.run(pyodide.toPy(fields.read())));   // [{shape, values}, ...]
//   $("outputs").textContent = outputText(result);
import { plain, row } from "./page.js";

function inputRow(onnxWeb, pyodide, input, index) {
  const dims = input.shape.map((d, i) => {
    if (typeof d === "number" && d > 0) return document.createTextNode(String(d));
    const field = document.createElement("input");
    Object.assign(field, { type: "number", min: "0", value: String(input.example_shape[i]), className: "dim",
                           title: String(d) });
    return field;
  });
  const shapeCell = document.createElement("span");
  dims.forEach((d, i) => { if (i) shapeCell.append(" × "); shapeCell.append(d); });
  const values = Object.assign(document.createElement("textarea"), { className: "values", rows: 3,
                                                                       value: input.values });
  values.dataset.input = input.name;
  const shape = () => dims.map((d) => (d instanceof HTMLInputElement ? Number(d.value) : Number(d.textContent)));
  for (const d of dims) {
    if (d instanceof HTMLInputElement) {
      d.addEventListener("input", () => {
        values.value = JSON.stringify(plain(onnxWeb.example(pyodide.toPy(shape()), input.type, index)));
      });
    }
  }
  return { tr: row([input.name, input.type, shapeCell, values]),
           read: () => ({ shape: shape(), values: values.value }) };
}

export function inputTable(table, onnxWeb, pyodide, inputs) {
  const rows = inputs.map((input, i) => inputRow(onnxWeb, pyodide, input, i));
  table.replaceChildren(row(["input", "type", "shape", "values (JSON)"], true), ...rows.map((r) => r.tr));
  return { read: () => rows.map((r) => r.read()) };
}

export function outputText(result) {
  return result.outputs.map((o) =>
    `${o.name} ${JSON.stringify(o.shape)}: ${o.values.slice(0, 10).map((v) => Number(v).toFixed(5)).join(", ")}` +
    (o.values.length > 10 ? " …" : "")).join("\n");
}
