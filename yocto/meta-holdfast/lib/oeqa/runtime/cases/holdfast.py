#
# SPDX-License-Identifier: MIT
#
# holdfast in a booted image: the kernel gives what `holdfast check` asks, br_netfilter
# was loaded at boot, the unit runs the agent, and the agent answers. Run with
#   IMAGE_CLASSES += "testimage"
#   TEST_SUITES = "ping ssh systemd holdfast"
# and `bitbake holdfast-image -c testimage` (runqemu, slirp or tap networking).

import time

from oeqa.core.decorator.depends import OETestDepends
from oeqa.runtime.case import OERuntimeTestCase
from oeqa.runtime.decorator.package import OEHasPackage


class HoldfastTest(OERuntimeTestCase):

    def run_ok(self, command):
        status, output = self.target.run(command)
        self.assertEqual(status, 0, msg='%s: exit %s\n%s' % (command, status, output))
        return output

    @OETestDepends(['ssh.SSHTest.test_ssh'])
    @OEHasPackage(['holdfast'])
    def test_holdfast_check(self):
        # Exit 0: every required item (namespaces, cgroups, overlayfs) is there.
        output = self.run_ok('holdfast check')
        for item in ('overlayfs:', 'veth:', 'bridge:', 'iptables (legacy or nf_tables):',
                     'br_netfilter:'):
            lines = [l.strip() for l in output.splitlines() if item in l]
            self.assertTrue(lines, msg='%s not reported:\n%s' % (item, output))
            self.assertTrue(lines[0].startswith('[ok]'), msg='%s\n%s' % (lines[0], output))

    @OETestDepends(['holdfast.HoldfastTest.test_holdfast_check'])
    def test_br_netfilter_loaded_at_boot(self):
        # systemd-modules-load read /usr/lib/modules-load.d/holdfast.conf.
        self.run_ok('test -e /proc/sys/net/bridge/bridge-nf-call-iptables')

    @OETestDepends(['holdfast.HoldfastTest.test_holdfast_check'])
    def test_agent_runs_and_answers(self):
        self.run_ok('systemctl is-enabled holdfast.service')
        # `holdfast status` reads the root dir when no agent answers on its socket:
        # "agent: running" is the agent's own answer.
        deadline = time.time() + 120
        output = ''
        while time.time() < deadline:
            output = self.target.run('holdfast status')[1]
            if 'agent:        running' in output:
                break
            time.sleep(2)
        self.assertIn('agent:        running', output, msg='holdfast status:\n%s\n%s' % (
            output, self.target.run('systemctl status --full holdfast.service')[1]))
        self.run_ok('systemctl is-active holdfast.service')
        # The store is the root's alone: it caches secrets for offline use.
        mode = self.run_ok('stat -c %a /var/lib/holdfast').strip()
        self.assertEqual(mode, '700', msg='/var/lib/holdfast mode %s' % mode)
