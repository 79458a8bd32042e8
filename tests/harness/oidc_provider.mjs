// A real OpenID Provider for the tests: the npm `oidc-provider` package (a certified
// implementation), configured from the JSON file named by argv[2] and listening on
// 127.0.0.1:<port>. tests/harness/oidc.py writes that file, installs the package and starts
// this script by its pid; nothing here is a stand-in for the protocol.
//
// Two shapes, chosen by `kind`:
// - "people": a site's identity provider. devInteractions (a plain login and consent form,
//   any login name accepted) and the device authorization grant are on; an account's claims
//   are derived from its login name (sub, preferred_username, email), or taken from
//   `accounts` when the test names them there.
// - "actions": GitHub Actions' token service. Discovery and the JWKS are the provider's, and
//   `GET /_actions/token?audience=A` with `Authorization: Bearer <request_token>` answers
//   `{"value": <ID token>}` as ACTIONS_ID_TOKEN_REQUEST_URL does, signed with the provider's
//   own key (jose, oidc-provider's JOSE library), with the `repository`/`ref` claims of the
//   config's `job`.
import fs from 'node:fs';
import crypto from 'node:crypto';

import Provider from 'oidc-provider';
import * as jose from 'jose';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${config.port}`;
const accounts = config.accounts || {};

function claimsOf(login) {
  const named = accounts[login] || {};
  return {
    sub: named.sub || login,
    preferred_username: named.preferred_username || login,
    email: named.email || `${login}@example.org`,
    email_verified: true,
    ...named,
  };
}

const provider = new Provider(issuer, {
  clients: config.clients || [],
  jwks: config.jwks,
  features: {
    devInteractions: { enabled: config.kind === 'people' },
    deviceFlow: { enabled: config.kind === 'people' },
    revocation: { enabled: true },
  },
  claims: {
    openid: ['sub'],
    profile: ['preferred_username'],
    email: ['email', 'email_verified'],
  },
  scopes: ['openid', 'offline_access', 'profile', 'email'],
  async findAccount(_ctx, id) {
    return { accountId: id, async claims() { return claimsOf(id); } };
  },
  async issueRefreshToken(_ctx, client, code) {
    return client.grantTypeAllowed('refresh_token') && code.scopes.has('offline_access');
  },
  // Sign in every time: a test's browser session says nothing about the next test.
  ttl: {
    AccessToken: 600,
    AuthorizationCode: 120,
    DeviceCode: 600,
    IdToken: config.id_token_ttl || 600,
    Interaction: 600,
    RefreshToken: 3600,
    Grant: 3600,
    Session: 600,
  },
  pkce: { required: () => true },
  // Claims in the ID token itself, as Keycloak, Entra ID and Okta put preferred_username and
  // email there: the daemon maps people by the ID token, not by a userinfo call.
  conformIdTokenClaims: false,
});
provider.proxy = false;

const privateKey = config.jwks.keys[0];
const signingKey = await jose.importJWK(privateKey, privateKey.alg || 'RS256');

provider.use(async (ctx, next) => {
  if (config.kind === 'actions' && ctx.path === '/_actions/token' && ctx.method === 'GET') {
    const auth = ctx.get('authorization') || '';
    if (auth !== `Bearer ${config.request_token}`) {
      ctx.status = 401;
      ctx.body = { message: 'Bad credentials' };
      return;
    }
    const job = { ...config.job };
    for (const key of ['repository', 'ref', 'environment']) {
      const asked = ctx.query[key];
      if (typeof asked === 'string') job[key] = asked;
    }
    const audience = ctx.query.audience || `https://github.com/${job.repository.split('/')[0]}`;
    // `skew` (seconds, tests only) moves iat/nbf/exp: a job on a machine whose clock is off.
    const now = Math.floor(Date.now() / 1000) + Number(ctx.query.skew || 0);
    const claims = {
      ...job,
      repository_owner: job.repository.split('/')[0],
      sub: `repo:${job.repository}:ref:${job.ref}`,
      jti: crypto.randomUUID(),
    };
    const value = await new jose.SignJWT(claims)
      .setProtectedHeader({ alg: privateKey.alg || 'RS256', kid: privateKey.kid, typ: 'JWT' })
      .setIssuer(issuer)
      .setAudience(audience)
      .setIssuedAt(now)
      .setNotBefore(now)
      .setExpirationTime(now + 300)
      .sign(signingKey);
    ctx.body = { count: 1, value };
    return;
  }
  await next();
});

const server = provider.listen(config.port, '127.0.0.1', () => {
  process.stdout.write(`listening ${issuer}\n`);
});

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => server.close(() => process.exit(0)));
}
