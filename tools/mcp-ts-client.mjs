// The official TypeScript SDK (@modelcontextprotocol/client) calling skilld's tools.
//
//   tools/mcp-ts-client URL MODE TOOL [TOOL...]   (MODE: legacy | 2026-07-28)
//
// Answers elicitation with {name: "Ada", color: "teal"}, sampling with "Paris" and
// roots with one root; prints one JSON line per tool: {tool, text, isError}.
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const [url, mode, ...tools] = process.argv.slice(2);
const client = new Client(
  { name: 'skilld-ts-test', version: '0.0.0' },
  {
    capabilities: { elicitation: {}, sampling: {}, roots: {} },
    versionNegotiation: { mode: mode === 'legacy' ? 'legacy' : { pin: mode } },
  },
);
client.setRequestHandler('elicitation/create', async () => ({
  action: 'accept',
  content: { name: 'Ada', color: 'teal' },
}));
client.setRequestHandler('sampling/createMessage', async () => ({
  model: 'fake',
  role: 'assistant',
  content: { type: 'text', text: 'Paris' },
}));
client.setRequestHandler('roots/list', async () => ({
  roots: [{ uri: 'file:///work', name: 'work' }],
}));
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
for (const name of tools) {
  const result = await client.callTool({ name, arguments: {} });
  const text = (result.content ?? []).filter((b) => b.type === 'text').map((b) => b.text).join('\n');
  console.log(JSON.stringify({ tool: name, text, isError: result.isError ?? false }));
}
await client.close();
