'use strict';
// The client of cardc's language server: VS Code starts `cardc lsp` (the executable the
// setting cardc.path names) and speaks the Language Server Protocol with it over stdio, for
// every card open in the editor. A change of cardc.path restarts the server.

const vscode = require('vscode');
const { LanguageClient, TransportKind } = require('vscode-languageclient/node');

let client;

function serverOptions() {
  const command = vscode.workspace.getConfiguration('cardc').get('path', 'cardc') || 'cardc';
  const server = { command, args: ['lsp'], transport: TransportKind.stdio };
  return { run: server, debug: server };
}

function clientOptions() {
  return {
    documentSelector: [
      { scheme: 'file', language: 'card' },
      { scheme: 'untitled', language: 'card' },
    ],
  };
}

async function startClient() {
  client = new LanguageClient('cardc', 'cardc language server', serverOptions(), clientOptions());
  try {
    await client.start();
  } catch (error) {
    vscode.window.showErrorMessage(
      `Could not start \`${serverOptions().run.command} lsp\` (set cardc.path): ${error.message}`);
  }
}

async function stopClient() {
  if (client) {
    const running = client;
    client = undefined;
    try {
      await running.stop();
    } catch {
      // it never started (a wrong cardc.path): nothing to stop
    }
  }
}

async function activate(context) {
  context.subscriptions.push(vscode.workspace.onDidChangeConfiguration(async (event) => {
    if (event.affectsConfiguration('cardc.path')) {
      await stopClient();
      await startClient();
    }
  }));
  await startClient();
}

function deactivate() {
  return stopClient();
}

module.exports = { activate, deactivate };
